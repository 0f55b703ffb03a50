"""Serializers of jobs: submission, lists and detail with pipelines and task groups."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from engine import dirty as dirty_tracking
from engine.api.serializers.checkpoints import CheckpointSummarySerializer
from engine.api.serializers.cleanup import CleanupRecordSerializer
from engine.api.serializers.cluster import MemberRefSerializer
from engine.api.serializers.dirty import DirtyTaskListSerializer, DirtyTaskSerializer
from engine.api.serializers.records import record
from engine.jobs import summary as job_summary
from engine.models import Job, JobCleanupRecord, TaskGroup
from engine.states import JOB_TERMINAL, CleanupKind, JobStatus

MAX_CONFIG_BYTES = 1_000_000


class JobSubmitSerializer(serializers.Serializer):
    config = serializers.CharField(
        trim_whitespace=False,
        max_length=MAX_CONFIG_BYTES,
        help_text="the job config, HOCON or JSON",
    )
    jobName = serializers.CharField(required=False, allow_blank=False, max_length=200)
    variables = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False, max_length=4096),
        required=False,
        help_text="values for ${NAME} substitutions the config does not define itself "
        "(SeaTunnel's -i NAME=value); the process environment is never consulted",
    )


ConfigWarningSerializer = record(
    __name__,
    "ConfigWarningSerializer",
    "An option accepted without effect here (another engine's, or one Keel does not need).",
    {"path": serializers.CharField(), "message": serializers.CharField()},
)
JobCreatedSerializer = record(
    __name__,
    "JobCreatedSerializer",
    "A submitted job, and what its config asked for that has no effect here.",
    {
        "jobId": serializers.IntegerField(),
        "jobName": serializers.CharField(),
        "jobStatus": serializers.ChoiceField(choices=JobStatus.choices),
        "warnings": ConfigWarningSerializer(many=True),
    },
)


class JobSummarySerializer(serializers.ModelSerializer):
    jobId = serializers.IntegerField(source="id")
    jobName = serializers.CharField(source="name")
    jobStatus = serializers.ChoiceField(source="status", choices=JobStatus.choices)
    createTime = serializers.DateTimeField(source="created_at")
    finishTime = serializers.DateTimeField(source="finished_at", allow_null=True)
    dirtyTask = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = ["jobId", "jobName", "jobStatus", "createTime", "finishTime", "dirtyTask"]

    @extend_schema_field(DirtyTaskListSerializer)
    def get_dirtyTask(self, job: Job) -> dict:
        return dirty_tracking.list_summary(job.dirty_evaluation, job.dirty_attempts)


class MetricsSerializer(serializers.Serializer):
    sourceReceivedCount = serializers.IntegerField()
    sinkWriteCount = serializers.IntegerField()
    sourceReceivedBytes = serializers.IntegerField(
        required=False,
        help_text="the Arrow size of the batches read (RecordBatch.nbytes); absent from the"
        " summary of a job that ended before bytes were counted",
    )
    sinkWriteBytes = serializers.IntegerField(
        required=False, help_text="the Arrow size of the batches written, as sourceReceivedBytes"
    )
    rowsPerSecond = serializers.FloatField()


class TaskGroupMetricsSerializer(MetricsSerializer):
    blockedSeconds = serializers.FloatField(
        required=False,
        help_text="seconds the task group's reader spent blocked writing into its sinks (its "
        "back-pressure); absent from the summary of a job that ended before it was measured",
    )
    backPressureRatio = serializers.FloatField(
        required=False,
        min_value=0,
        max_value=1,
        help_text="blockedSeconds over the seconds the task group has run, 0 to 1 (3 places)",
    )


class SlotRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    sequence = serializers.IntegerField()


class TaskGroupSourceRuntimeSerializer(serializers.Serializer):
    mailbox = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="commands, bytes, reservedInUse, oldestAgeMs (an enumerator: its commands "
        "not yet admitted)",
    )
    admissions = serializers.DictField(
        child=serializers.IntegerField(), help_text="admission answers by AdmissionAck status"
    )
    assignments = serializers.DictField(
        child=serializers.IntegerField(), help_text="split assignments by tracker state"
    )


class TaskGroupSerializer(serializers.ModelSerializer):
    taskGroupId = serializers.IntegerField(source="id")
    member = MemberRefSerializer(allow_null=True)
    slot = SlotRefSerializer(
        allow_null=True, help_text="the slot it runs on, or ran on last once it ended"
    )
    errorMsg = serializers.CharField(source="error_msg")
    metrics = serializers.SerializerMethodField()
    sourceRuntime = TaskGroupSourceRuntimeSerializer(
        source="source_runtime", allow_null=True, help_text="Lane A only"
    )

    class Meta:
        model = TaskGroup
        fields = [
            "taskGroupId",
            "kind",
            "index",
            "status",
            "attempt",
            "member",
            "slot",
            "errorMsg",
            "metrics",
            "sourceRuntime",
        ]

    @extend_schema_field(TaskGroupMetricsSerializer)
    def get_metrics(self, group: TaskGroup) -> dict:
        return job_summary.group_metrics(group)


class SourceRuntimeSerializer(serializers.Serializer):
    lane = serializers.ChoiceField(choices=["A", "B"], help_text="A: managed; B: legacy")
    capabilityDigest = serializers.CharField(allow_null=True)


class PipelineSerializer(serializers.Serializer):
    pipelineId = serializers.IntegerField(source="index")
    status = serializers.CharField()
    restoreCount = serializers.IntegerField(source="restore_count")
    errorMsg = serializers.CharField(source="error_msg")
    parallelism = serializers.IntegerField(
        required=True, help_text="its readers: as planned, or as a rescale made them"
    )
    sourceRuntime = SourceRuntimeSerializer()
    taskGroups = TaskGroupSerializer(source="task_groups.all", many=True)


class JobDetailSerializer(JobSummarySerializer):
    errorMsg = serializers.CharField(source="error_msg")
    pendingReason = serializers.CharField(
        source="pending_reason", help_text="why a PENDING job is not scheduled yet"
    )
    submittedBy = serializers.SlugRelatedField(
        source="submitted_by", slug_field="username", read_only=True, allow_null=True
    )
    canceledBy = serializers.SlugRelatedField(
        source="canceled_by", slug_field="username", read_only=True, allow_null=True
    )
    config = serializers.CharField(
        source="config_text", help_text="the config as submitted, secret values redacted"
    )
    envOptions = serializers.JSONField(source="env")
    slotsNeeded = serializers.IntegerField(source="slots_needed")
    pipelines = serializers.SerializerMethodField()
    metrics = serializers.SerializerMethodField()
    checkpoints = serializers.SerializerMethodField()
    cleanup = serializers.SerializerMethodField()

    class Meta(JobSummarySerializer.Meta):
        fields = [
            *JobSummarySerializer.Meta.fields,
            "errorMsg",
            "pendingReason",
            "submittedBy",
            "canceledBy",
            "config",
            "envOptions",
            "slotsNeeded",
            "pipelines",
            "metrics",
            "checkpoints",
            "cleanup",
        ]

    @extend_schema_field(DirtyTaskSerializer)
    def get_dirtyTask(self, job: Job) -> dict:
        """The summary, with the recent episodes in detail (never in lists: the seed's REST
        contract, bounded by engine.dirty-task.event-history-size)."""
        summary = dirty_tracking.job_summary(job)
        if summary["evaluationStatus"] == "DISABLED":
            return summary
        return {**summary, "recentEpisodes": dirty_tracking.job_episodes(job)}

    def _ended(self, job: Job) -> dict | None:
        """An ended job reads from its history (the same before and after its running state
        is cleaned up)."""
        if job.status not in JOB_TERMINAL:
            return None
        history = getattr(job, "history", None)
        return history.summary if history is not None and history.summary else None

    @extend_schema_field(PipelineSerializer(many=True))
    def get_pipelines(self, job: Job) -> list[dict]:
        ended = self._ended(job)
        return ended["pipelines"] if ended else job_summary.pipelines(job)

    @extend_schema_field(CheckpointSummarySerializer)
    def get_checkpoints(self, job: Job) -> dict:
        ended = self._ended(job)
        return ended["checkpoints"] if ended else job_summary.checkpoints(job)

    @extend_schema_field(MetricsSerializer)
    def get_metrics(self, job: Job) -> dict:
        ended = self._ended(job)
        return ended["metrics"] if ended else job_summary.metrics(job)

    @extend_schema_field(CleanupRecordSerializer(allow_null=True))
    def get_cleanup(self, job: Job) -> dict | None:
        record = JobCleanupRecord.objects.filter(job_id=job.id, kind=CleanupKind.JOB_STATE).first()
        return CleanupRecordSerializer(record).data if record else None
