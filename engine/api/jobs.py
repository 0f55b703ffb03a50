"""Job endpoints: submit, list, detail, cancel. Views validate and call engine.jobs."""

from __future__ import annotations

import django_filters
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import dirty as dirty_tracking
from engine.jobconfig import ConfigError
from engine.jobs import JobStateError, cancel_job, submit_job
from engine.models import Checkpoint, Job, TaskGroup
from engine.states import JobStatus

from .serializers import MemberRefSerializer

MAX_CONFIG_BYTES = 1_000_000


class JobSubmitSerializer(serializers.Serializer):
    config = serializers.CharField(
        trim_whitespace=False,
        max_length=MAX_CONFIG_BYTES,
        help_text="the job config, HOCON or JSON",
    )
    jobName = serializers.CharField(required=False, allow_blank=False, max_length=200)


class JobCreatedSerializer(serializers.Serializer):
    jobId = serializers.IntegerField()
    jobName = serializers.CharField()
    jobStatus = serializers.ChoiceField(choices=JobStatus.choices)


class DirtyTaskListSerializer(serializers.Serializer):
    """The dirty-job label in job lists; a disabled job has only the first two fields."""

    dirty = serializers.BooleanField()
    evaluationStatus = serializers.ChoiceField(choices=dirty_tracking.EVALUATIONS)
    recoveryAttemptCount = serializers.IntegerField(required=False)


class DirtyTaskSerializer(DirtyTaskListSerializer):
    """The dirty-job (recovery-degraded) summary of a running or finished job (engine.dirty);
    a disabled job has only ``dirty`` and ``evaluationStatus``."""

    trackingComplete = serializers.BooleanField(required=False)
    threshold = serializers.IntegerField(required=False)
    recoveryEpisodeCount = serializers.IntegerField(required=False)
    memberLossIncidentCount = serializers.IntegerField(required=False)
    activeEpisodeId = serializers.IntegerField(required=False, allow_null=True)
    lastLeaveClassification = serializers.CharField(required=False, allow_null=True)
    lastLostMemberUuid = serializers.UUIDField(required=False, allow_null=True)
    lastLostAddress = serializers.CharField(required=False, allow_null=True)
    lastCountedTime = serializers.IntegerField(
        required=False, allow_null=True, help_text="epoch milliseconds"
    )
    firstDirtyTime = serializers.IntegerField(
        required=False, allow_null=True, help_text="epoch milliseconds"
    )
    incompleteReason = serializers.CharField(
        required=False, allow_null=True, help_text="why the evaluation is UNKNOWN"
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
    rowsPerSecond = serializers.FloatField()


class SlotRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    sequence = serializers.IntegerField()


class TaskGroupSerializer(serializers.ModelSerializer):
    taskGroupId = serializers.IntegerField(source="id")
    member = MemberRefSerializer(allow_null=True)
    slot = SlotRefSerializer(allow_null=True)
    errorMsg = serializers.CharField(source="error_msg")
    metrics = serializers.SerializerMethodField()

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
        ]

    @extend_schema_field(MetricsSerializer)
    def get_metrics(self, group: TaskGroup) -> dict:
        return {
            "sourceReceivedCount": group.source_received,
            "sinkWriteCount": group.sink_written,
            "rowsPerSecond": round(group.rows_per_second, 1),
        }


class PipelineSerializer(serializers.Serializer):
    pipelineId = serializers.IntegerField(source="index")
    status = serializers.CharField()
    restoreCount = serializers.IntegerField(source="restore_count")
    errorMsg = serializers.CharField(source="error_msg")
    taskGroups = TaskGroupSerializer(source="task_groups.all", many=True)


class CheckpointSummarySerializer(serializers.Serializer):
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()
    latestId = serializers.IntegerField(allow_null=True)
    latestAt = serializers.DateTimeField(allow_null=True)


class CheckpointSerializer(serializers.ModelSerializer):
    checkpointId = serializers.IntegerField(source="id")
    pipelineId = serializers.IntegerField(source="pipeline.index")
    triggeredAt = serializers.DateTimeField(source="triggered_at")
    endedAt = serializers.DateTimeField(source="ended_at", allow_null=True)
    durationMs = serializers.SerializerMethodField()
    failureReason = serializers.CharField(source="failure_reason")

    class Meta:
        model = Checkpoint
        fields = [
            "checkpointId",
            "pipelineId",
            "state",
            "triggeredAt",
            "endedAt",
            "durationMs",
            "failureReason",
        ]

    def get_durationMs(self, checkpoint: Checkpoint) -> int | None:
        if checkpoint.ended_at is None:
            return None
        return int((checkpoint.ended_at - checkpoint.triggered_at).total_seconds() * 1000)


class JobCheckpointListView(generics.ListAPIView):
    """The job's recent checkpoints, newest first (at most 100)."""

    serializer_class = CheckpointSerializer
    pagination_class = None

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return Checkpoint.objects.none()
        job = get_object_or_404(Job, id=self.kwargs["job_id"])
        return Checkpoint.objects.filter(job=job).select_related("pipeline").order_by("-id")[:100]


class EpisodeIncidentSerializer(serializers.Serializer):
    lostMemberUuid = serializers.UUIDField()
    lostAddress = serializers.CharField()
    classification = serializers.CharField()
    at = serializers.DateTimeField()


class EpisodeAttemptSerializer(serializers.Serializer):
    attemptId = serializers.CharField(help_text="<episodeId>-<pipelineId>-<prepareSequence>")
    pipelineId = serializers.IntegerField()
    prepareSequence = serializers.IntegerField()
    state = serializers.ChoiceField(choices=["PREPARED", "CONFIRMED", "ABORTED"])
    at = serializers.DateTimeField()


class EpisodeSerializer(serializers.Serializer):
    episodeId = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["ACTIVE", "COMPLETED", "ABORTED"])
    startedAt = serializers.DateTimeField()
    endedAt = serializers.DateTimeField(allow_null=True)
    generation = serializers.IntegerField()
    classification = serializers.CharField()
    endReason = serializers.CharField(allow_null=True)
    incidents = EpisodeIncidentSerializer(many=True)
    attempts = EpisodeAttemptSerializer(many=True)


class JobEpisodeListView(APIView):
    """The job's recent recovery episodes (at most engine.dirty-task.event-history-size),
    newest first; the same for running and finished jobs."""

    @extend_schema(responses={200: EpisodeSerializer(many=True)}, operation_id="jobs_episodes")
    def get(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(Job, id=job_id)
        return Response(dirty_tracking.job_episodes(job))


class JobDetailSerializer(JobSummarySerializer):
    errorMsg = serializers.CharField(source="error_msg")
    envOptions = serializers.JSONField(source="env")
    slotsNeeded = serializers.IntegerField(source="slots_needed")
    pipelines = PipelineSerializer(many=True)
    metrics = serializers.SerializerMethodField()
    checkpoints = serializers.SerializerMethodField()

    class Meta(JobSummarySerializer.Meta):
        fields = [
            *JobSummarySerializer.Meta.fields,
            "errorMsg",
            "envOptions",
            "slotsNeeded",
            "pipelines",
            "metrics",
            "checkpoints",
        ]

    @extend_schema_field(DirtyTaskSerializer)
    def get_dirtyTask(self, job: Job) -> dict:
        return dirty_tracking.job_summary(job)

    @extend_schema_field(CheckpointSummarySerializer)
    def get_checkpoints(self, job: Job) -> dict:
        pipelines = job.pipelines.all()
        latest = (
            Checkpoint.objects.filter(job=job, state=Checkpoint.State.COMPLETED)
            .order_by("-id")
            .values("id", "ended_at")
            .first()
        )
        return {
            "completed": sum(p.checkpoints_completed for p in pipelines),
            "failed": sum(p.checkpoints_failed for p in pipelines),
            "latestId": latest["id"] if latest else None,
            "latestAt": latest["ended_at"] if latest else None,
        }

    @extend_schema_field(MetricsSerializer)
    def get_metrics(self, job: Job) -> dict:
        groups = [g for p in job.pipelines.all() for g in p.task_groups.all()]
        return {
            "sourceReceivedCount": sum(g.source_received for g in groups),
            "sinkWriteCount": sum(g.sink_written for g in groups),
            "rowsPerSecond": round(
                sum(g.rows_per_second for g in groups if g.status == "RUNNING"), 1
            ),
        }


class JobFilter(django_filters.FilterSet):
    jobStatus = django_filters.ChoiceFilter(field_name="status", choices=JobStatus.choices)
    dirty = django_filters.BooleanFilter(method="filter_dirty", label="dirty")
    evaluationStatus = django_filters.ChoiceFilter(
        field_name="dirty_evaluation", choices=[(e, e) for e in dirty_tracking.EVALUATIONS]
    )

    class Meta:
        model = Job
        fields = ["jobStatus", "dirty", "evaluationStatus"]

    def filter_dirty(self, queryset, name, value):
        return queryset if value is None else queryset.filter(dirty_tracking.dirty_filter(value))


class JobPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "pageSize"
    max_page_size = 500


class JobListView(generics.ListAPIView):
    """Jobs, newest first; ``?jobStatus=``, ``?dirty=`` and ``?evaluationStatus=`` filter.
    POST submits a job."""

    serializer_class = JobSummarySerializer
    filterset_class = JobFilter
    pagination_class = JobPagination

    def get_queryset(self):
        return dirty_tracking.annotate(Job.objects.order_by("-id"))

    @extend_schema(
        request=JobSubmitSerializer,
        responses={201: JobCreatedSerializer},
        operation_id="jobs_submit",
    )
    def post(self, request: Request) -> Response:
        body = JobSubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            job = submit_job(body.validated_data["config"], body.validated_data.get("jobName"))
        except ConfigError as exc:
            raise ValidationError({"errors": exc.errors}) from None
        return Response(
            {"jobId": job.id, "jobName": job.name, "jobStatus": job.status},
            status=status.HTTP_201_CREATED,
        )


class JobDetailView(generics.RetrieveAPIView):
    serializer_class = JobDetailSerializer
    lookup_url_kwarg = "job_id"

    def get_queryset(self):
        groups = TaskGroup.objects.select_related("member", "slot").order_by("kind", "index")
        return Job.objects.prefetch_related(Prefetch("pipelines__task_groups", queryset=groups))


class JobCancelView(APIView):
    @extend_schema(request=None, responses={202: JobCreatedSerializer}, operation_id="jobs_cancel")
    def post(self, request: Request, job_id: int) -> Response:
        get_object_or_404(Job, id=job_id)
        try:
            job = cancel_job(job_id)
        except JobStateError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(
            {"jobId": job.id, "jobName": job.name, "jobStatus": job.status},
            status=status.HTTP_202_ACCEPTED,
        )
