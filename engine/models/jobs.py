"""Jobs as the engine runs them: jobs, pipelines, task groups, split assignments and durable
control steps."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from engine.states import (
    EXECUTION_DEPLOYED,
    EXECUTION_LIVE,
    ControlStepState,
    ExecutionStatus,
    JobStatus,
    MemberState,
    TaskGroupKind,
)

from .cluster import Member, Slot
from .fields import OrderedJSONField


class Job(models.Model):
    """A submitted job: its config, plan and status (see engine.states.JOB_TRANSITIONS)."""

    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=JobStatus.choices, db_index=True)
    mode = models.CharField(max_length=16)
    config_text = models.TextField()
    env = models.JSONField(default=dict)
    slots_needed = models.IntegerField()
    error_msg = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    #: ``job.dirty-task.threshold`` (<= 0: dirty-job tracking disabled; see engine.dirty).
    dirty_threshold = models.IntegerField(default=-1)
    #: Who submitted and who cancelled it (the audit the API and the admin show).
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    canceled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: Why a PENDING job is not scheduled yet ("needs 11 slots, the cluster has 8"); empty
    #: once it is, or while nothing holds it back.
    pending_reason = models.CharField(max_length=300, blank=True, default="")
    #: Unique beyond this engine database (job ids restart in every cluster): names what the
    #: job leaves in other systems, such as a Jdbc sink's staged rows and sessions. Given only
    #: when every alive member can use it (engine.jobs.submission); a job without one keeps
    #: the names of its id, which every member agrees on.
    uuid = models.UUIDField(null=True, blank=True, editable=False)
    #: When its sinks' save modes (SeaTunnel's ``data_save_mode`` and ``schema_save_mode``)
    #: were applied, once, before its first split was assigned (engine.member.savemodes); a
    #: restore or a later pipeline finds it set and applies nothing again.
    save_modes_applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status", "id"]), models.Index(fields=["finished_at"])]
        permissions = [
            ("submit_job", "Can submit jobs"),
            ("cancel_job", "Can cancel jobs"),
            ("acknowledge_dirty", "Can acknowledge a job's UNKNOWN recovery tracking"),
        ]

    def __str__(self) -> str:
        return f"job {self.id} {self.name} ({self.status})"


class Pipeline(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="pipelines")
    index = models.IntegerField(help_text="pipelineId, 1-based within the job")
    status = models.CharField(
        max_length=16, choices=ExecutionStatus.choices, default=ExecutionStatus.CREATED
    )
    restore_count = models.IntegerField(default=0)
    #: Restores the master made to move task groups off a drained member: they do not use up
    #: ``job.retry.times`` (a planned leave must not cost a job its retries).
    planned_restores = models.IntegerField(default=0, db_default=0)
    plan = OrderedJSONField()
    #: Set by the enumerator once every split is assigned (readers wait for it).
    splits_assigned = models.BooleanField(default=False)
    #: Checkpoints ever completed / failed (the rows themselves are pruned to the retained few).
    checkpoints_completed = models.IntegerField(default=0)
    checkpoints_failed = models.IntegerField(default=0)
    error_msg = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["job_id", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="pipeline_job_index")]
        #: The master's scans look for the few live pipelines among every finished one.
        indexes = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"pipeline {self.index} of job {self.job_id}"


class TaskGroupQuerySet(models.QuerySet):
    def live(self) -> TaskGroupQuerySet:
        """Not ended: neither FINISHED, FAILED nor CANCELED (as an IN list: the status index
        finds the few live ones among every finished one)."""
        return self.filter(status__in=EXECUTION_LIVE)

    def deployed(self) -> TaskGroupQuerySet:
        """Placed on a member and not ended (DEPLOYING, RUNNING, FAILING or CANCELING)."""
        return self.filter(status__in=EXECUTION_DEPLOYED)

    def on_alive_members(self) -> TaskGroupQuerySet:
        return self.filter(member__state=MemberState.ALIVE)

    def on_lost_members(self) -> TaskGroupQuerySet:
        """Whose member is REMOVED or LEFT (or gone): they can never report again."""
        return self.exclude(member__state=MemberState.ALIVE)

    def stopping(self) -> TaskGroupQuerySet:
        """Live task groups to cancel: those of CANCELING or FAILING jobs, and the rest of a
        FAILING pipeline (one about to restore, say), on members that can act on it."""
        stopping = Q(job__status__in=[JobStatus.CANCELING, JobStatus.FAILING]) | Q(
            pipeline__status=ExecutionStatus.FAILING
        )
        return self.filter(stopping).on_alive_members().live()


class TaskGroup(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="task_groups")
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="task_groups")
    kind = models.CharField(max_length=16, choices=TaskGroupKind.choices)
    index = models.IntegerField(help_text="reader index (0 for the enumerator)")
    status = models.CharField(
        max_length=16, choices=ExecutionStatus.choices, default=ExecutionStatus.CREATED
    )
    #: Rises on every (re)deployment; commands and reports of an older attempt are rejected.
    attempt = models.IntegerField(default=0)
    member = models.ForeignKey(
        Member, null=True, blank=True, on_delete=models.SET_NULL, related_name="task_groups"
    )
    #: The slot it holds: only while it is live (DEPLOYING to CANCELING). It lets go of it in
    #: the transaction that ends it, so nothing can free a slot in its name afterwards.
    slot = models.ForeignKey(
        Slot, null=True, blank=True, on_delete=models.SET_NULL, related_name="task_groups"
    )
    #: Where its latest attempt ran (kept when it ends): for display only, never an ownership.
    last_slot = models.ForeignKey(
        Slot, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error_msg = models.TextField(blank=True, default="")
    #: Set when the task group failed because its member was lost (such failures restore).
    lost_member = models.ForeignKey(
        Member, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: The loss was a planned move: the master took it off a drained member (engine.cluster.drain).
    planned_move = models.BooleanField(default=False, db_default=False)
    source_received = models.BigIntegerField(default=0)
    sink_written = models.BigIntegerField(default=0)
    #: The same in Arrow bytes (``RecordBatch.nbytes`` of the batches read and written).
    source_received_bytes = models.BigIntegerField(default=0, db_default=0)
    sink_written_bytes = models.BigIntegerField(default=0, db_default=0)
    rows_per_second = models.FloatField(default=0.0)
    #: Wall-clock and thread CPU seconds the data plane ran (for per-slot throughput).
    busy_seconds = models.FloatField(default=0.0)
    cpu_seconds = models.FloatField(default=0.0)
    #: Wall-clock seconds its data plane waited on its output (back-pressure), both lanes.
    blocked_seconds = models.FloatField(default=0.0, db_default=0.0)
    #: A Lane A task group's runtime metrics, as its last report had them (mailbox, admissions,
    #: assignments by state, poll or coordinator counters); null in Lane B.
    source_runtime = models.JSONField(null=True, blank=True)
    deployed_at = models.DateTimeField(null=True, blank=True)
    #: A checkpointed batch reader read all its input: it now waits for the checkpoint that
    #: includes its end (its final checkpoint, triggered at once) and commits it before it ends.
    input_ended_at = models.DateTimeField(null=True, blank=True)
    #: A Lane A reader asked for a checkpoint now (a schema change waits for one): the master
    #: triggers one at once when this is newer than the pipeline's last checkpoint.
    checkpoint_requested_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    objects = TaskGroupQuerySet.as_manager()

    class Meta:
        ordering = ["pipeline_id", "kind", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["pipeline", "kind", "index"], name="taskgroup_pipeline_kind_index"
            ),
            # Exactly the slots a job holds are assigned: one live task group per slot, and
            # an ended one holds none (the database refuses a double booking outright).
            models.UniqueConstraint(
                fields=["slot"],
                condition=Q(status__in=sorted(EXECUTION_LIVE)),
                name="taskgroup_one_live_per_slot",
            ),
            models.CheckConstraint(
                condition=Q(slot__isnull=True) | Q(status__in=sorted(EXECUTION_LIVE)),
                name="taskgroup_ended_holds_no_slot",
            ),
        ]
        indexes = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.index} of pipeline {self.pipeline_id}"


class SplitAssignment(models.Model):
    """A source split given to a reader by the enumerator, with the reader's offset in it."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="splits")
    split_id = models.CharField(max_length=200)
    split = models.JSONField()
    reader_index = models.IntegerField()
    offset = models.BigIntegerField(default=0)
    done = models.BooleanField(default=False)

    class Meta:
        ordering = ["pipeline_id", "reader_index", "id"]
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "split_id"], name="split_pipeline_id")
        ]

    def __str__(self) -> str:
        return f"split {self.split_id} -> reader {self.reader_index}"


class ControlStep(models.Model):
    """A durable control step (e.g. a pipeline restore): the row is the intent.

    The active master enqueues due steps on Celery's ``control`` queue (acks_late) and re-enqueues
    any that are not DONE after a while or were enqueued under an older epoch; the step runs under
    the epoch it was enqueued with, and is idempotent by its stable ``key``.
    """

    key = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=64)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="control_steps")
    payload = models.JSONField(default=dict)
    state = models.CharField(
        max_length=16, choices=ControlStepState.choices, default=ControlStepState.PENDING
    )
    due_at = models.DateTimeField(db_default=Now())
    epoch = models.BigIntegerField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    created_at = models.DateTimeField(db_default=Now())
    done_at = models.DateTimeField(null=True, blank=True)
    result = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["state", "due_at"])]

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"
