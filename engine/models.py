"""Cluster state kept in PostgreSQL, the engine's only source of truth."""

from __future__ import annotations

import json
import uuid

from django.db import models
from django.db.models.functions import Now

from .states import (
    CandidateState,
    ExecutionStatus,
    JobStatus,
    MemberState,
    SlotMode,
    SlotState,
    TaskGroupKind,
)


class OrderedJSONField(models.TextField):
    """JSON kept as text, so object key order survives (jsonb sorts keys).

    Plans depend on order: ``field_mapper { id = a, name = b }`` maps fields in that order and
    ``schema { fields { ... } }`` declares columns in that order.
    """

    def from_db_value(self, value, expression, connection):
        return None if value is None else json.loads(value)

    def to_python(self, value):
        return json.loads(value) if isinstance(value, str) else value

    def get_prep_value(self, value):
        return None if value is None else json.dumps(value)


class MasterLease(models.Model):
    """Singleton (id=1): who the active master is, and the fencing epoch.

    ``epoch`` grows by one on every takeover and is the fencing token: every write made on behalf
    of the active master re-reads it under a key-share row lock inside its own transaction
    (``engine.fencing``). ``lock_backend_pid`` is the PostgreSQL backend that holds the leadership
    advisory lock, so a standby can end a frozen holder's session once the lease has expired.
    """

    id = models.SmallIntegerField(primary_key=True, default=1)
    epoch = models.BigIntegerField(default=0)
    holder = models.CharField(max_length=200, blank=True, default="")
    lock_backend_pid = models.IntegerField(null=True, blank=True)
    since = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"epoch {self.epoch} held by {self.holder or 'nobody'}"


class ClusterState(models.Model):
    """Singleton (id=1): cluster-wide counters that must rise exactly once per event."""

    id = models.SmallIntegerField(primary_key=True, default=1)
    #: Global member-event sequence: +1 in the transaction that marks a member REMOVED or LEFT.
    member_event_sequence = models.BigIntegerField(default=0)
    #: The member events every dirty-tracking job has handled, except those recorded in
    #: DirtyTrackingGap: the jobs' shared watermark (engine.dirty). Behind the sequence: UNKNOWN.
    dirty_handled_sequence = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"member-event sequence {self.member_event_sequence}"


class MasterCandidate(models.Model):
    """One row per master process name: what it believes it is (for operators and tests).

    Writing this row is not a write on behalf of the active master, so it is not fenced; it is how
    a deposed master reports that its writes were rejected.
    """

    name = models.CharField(max_length=200, unique=True)
    pid = models.IntegerField()
    host = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=CandidateState.choices)
    epoch = models.BigIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(db_default=Now())
    last_seen = models.DateTimeField(db_default=Now())
    fenced_rejections = models.IntegerField(default=0)
    last_rejected_epoch = models.BigIntegerField(null=True, blank=True)
    #: The protocol version this master runs (engine.protocol); 0 for rows written before it.
    protocol_version = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"


class Member(models.Model):
    """An engine member: one worker process, from its start to its end.

    Every start is a new member with a fresh UUID; a restarted worker never resumes an old
    identity. ``lock_key`` is the member's session advisory lock key: the lock is held for the
    member's life by a dedicated connection, so the master sees a crash the moment PostgreSQL ends
    that session, well before the heartbeat timeout.
    """

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=200, db_index=True)
    address = models.CharField(max_length=255)
    host = models.CharField(max_length=200)
    pid = models.IntegerField()
    state = models.CharField(
        max_length=16, choices=MemberState.choices, default=MemberState.ALIVE, db_index=True
    )
    slot_mode = models.CharField(max_length=16, choices=SlotMode.choices)
    slot_count = models.IntegerField(help_text="fixed slots; for dynamic mode 0 means unbounded")
    protocol_version = models.IntegerField()
    started_at = models.DateTimeField(db_default=Now())
    last_heartbeat = models.DateTimeField(db_default=Now())
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["state", "last_heartbeat"])]

    def __str__(self) -> str:
        return f"{self.name} {self.uuid} ({self.state})"


class Slot(models.Model):
    """A member slot: fixed members own ``slot_count`` rows; dynamic ones get rows on demand."""

    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="slots")
    sequence = models.IntegerField()
    state = models.CharField(max_length=16, choices=SlotState.choices, default=SlotState.FREE)

    class Meta:
        ordering = ["member_id", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["member", "sequence"], name="slot_member_sequence")
        ]

    def __str__(self) -> str:
        return f"slot {self.sequence} of {self.member_id}"


class EngineEvent(models.Model):
    """The event store: appended in the same transaction as every cluster state change.

    ``seq`` values become visible in order (see engine.events): a reader that pages with
    ``after=seq`` never skips an event that commits late.
    """

    seq = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(db_default=Now())
    kind = models.CharField(max_length=64, db_index=True)
    job_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    member = models.ForeignKey(
        Member, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    #: The master epoch the event was written under (None for events written by a member).
    epoch = models.BigIntegerField(null=True, blank=True)
    payload = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind}"


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

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status", "id"])]

    def __str__(self) -> str:
        return f"job {self.id} {self.name} ({self.status})"


class Pipeline(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="pipelines")
    index = models.IntegerField(help_text="pipelineId, 1-based within the job")
    status = models.CharField(
        max_length=16, choices=ExecutionStatus.choices, default=ExecutionStatus.CREATED
    )
    restore_count = models.IntegerField(default=0)
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

    def __str__(self) -> str:
        return f"pipeline {self.index} of job {self.job_id}"


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
    slot = models.ForeignKey(
        Slot, null=True, blank=True, on_delete=models.SET_NULL, related_name="task_groups"
    )
    error_msg = models.TextField(blank=True, default="")
    #: Set when the task group failed because its member was lost (such failures restore).
    lost_member = models.ForeignKey(
        Member, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    source_received = models.BigIntegerField(default=0)
    sink_written = models.BigIntegerField(default=0)
    rows_per_second = models.FloatField(default=0.0)
    #: Wall-clock and thread CPU seconds the data plane ran (for per-slot throughput).
    busy_seconds = models.FloatField(default=0.0)
    cpu_seconds = models.FloatField(default=0.0)
    deployed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["pipeline_id", "kind", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["pipeline", "kind", "index"], name="taskgroup_pipeline_kind_index"
            )
        ]

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

    class State(models.TextChoices):
        PENDING = "PENDING"
        DONE = "DONE"

    key = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=64)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="control_steps")
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
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


class Checkpoint(models.Model):
    """Checkpoint N of a pipeline. Ids come from one sequence: they only grow, whoever leads."""

    class State(models.TextChoices):
        PENDING = "PENDING"
        COMPLETED = "COMPLETED"
        FAILED = "FAILED"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="checkpoints")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    #: {task group id: attempt} the barrier went to; acks of other attempts do not count.
    expected = models.JSONField(default=dict)
    triggered_at = models.DateTimeField(db_default=Now())
    ended_at = models.DateTimeField(null=True, blank=True)
    failure_reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["pipeline", "state", "id"])]

    def __str__(self) -> str:
        return f"checkpoint {self.id} of pipeline {self.pipeline_id} ({self.state})"


class TaskCheckpoint(models.Model):
    """One task group's snapshot at a barrier: reader positions and sink pre-commit states."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="acks")
    task_group = models.ForeignKey(TaskGroup, on_delete=models.CASCADE, related_name="+")
    attempt = models.IntegerField()
    state = OrderedJSONField()
    acked_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "task_group"], name="ack_once")
        ]

    def __str__(self) -> str:
        return f"ack of {self.task_group_id} for checkpoint {self.checkpoint_id}"


class DirtyJobState(models.Model):
    """The running dirty-job (recovery-degraded) state of one tracking-enabled job.

    Created in the job's submit transaction, so an enabled job is never schedulable without it;
    every change takes this row's lock (after the job row's, where both are taken) in one short
    transaction with its EngineEvent. Deleted in the job's terminal transaction, right after the
    history snapshot (history.JobHistory) is written. See engine.dirty.
    """

    job = models.OneToOneField(
        Job, primary_key=True, on_delete=models.CASCADE, related_name="dirty_state"
    )
    #: The layout version of this row; a reader that does not know it reports UNKNOWN.
    schema_version = models.SmallIntegerField(default=1)
    threshold = models.IntegerField()
    dirty = models.BooleanField(default=False)
    recovery_attempt_count = models.IntegerField(default=0)
    recovery_episode_count = models.IntegerField(default=0)
    member_loss_incident_count = models.IntegerField(default=0)
    active_episode = models.ForeignKey(
        "RecoveryEpisode",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,  # see RecoveryEpisode.job
    )
    last_leave_classification = models.CharField(max_length=32, blank=True, default="")
    last_lost_member_uuid = models.UUIDField(null=True, blank=True)
    last_lost_address = models.CharField(max_length=255, blank=True, default="")
    last_counted_at = models.DateTimeField(null=True, blank=True)
    first_dirty_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"dirty state of job {self.job_id}"


class DirtyTrackingGap(models.Model):
    """Something a tracking-enabled job could not record: while a gap exists the job evaluates
    UNKNOWN, never CLEAN.

    - ``member_event_sequence``: the member event it could not handle. Its watermark stays just
      before it for ever (a permanent gap).
    - ``repairable``: a tracker update that failed but whose truth is still in the engine's
      state (an attempt confirmation, an episode completion, the terminal snapshot). The
      master's reconciliation redoes it and then removes the gap.

    A separate table without a database constraint to the job (no key-share lock on the job
    row): recording a gap never waits for the rows whose update just failed.
    """

    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="dirty_gaps", db_constraint=False
    )
    member_event_sequence = models.BigIntegerField(null=True, blank=True)
    repairable = models.BooleanField(default=False)
    reason = models.TextField(blank=True, default="")
    at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"tracking gap of job {self.job_id}: {self.reason}"


class RecoveryEpisode(models.Model):
    """One continuous member-loss recovery of a job: from its first incident until every affected
    pipeline has been redeployed and runs (COMPLETED), or the job can no longer restore
    (ABORTED). The ``id`` is the stable episodeId."""

    class Status(models.TextChoices):
        ACTIVE = "ACTIVE"
        COMPLETED = "COMPLETED"
        ABORTED = "ABORTED"

    #: No database constraint on the references written by a member loss (here, the incident's
    #: and the state's): each check takes a FOR KEY SHARE row lock, a WAL-logged write, and they
    #: were a third of a member removal's cost with 1,000 jobs (bench/member_loss). engine.dirty
    #: is their only writer, under the job's state-row lock; deletes go through the ORM, which
    #: applies on_delete (ADR 0007).
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="recovery_episodes", db_constraint=False
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    classification = models.CharField(max_length=32)
    #: The job-level generation: the highest confirmed prepare sequence of any pipeline.
    generation = models.IntegerField(default=0)
    started_at = models.DateTimeField(db_default=Now())
    last_activity_at = models.DateTimeField(db_default=Now())
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-id"]
        # Not on last_activity_at: every loss and attempt touches it (kept a HOT update).
        indexes = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"episode {self.id} of job {self.job_id} ({self.status})"


class MemberLossIncident(models.Model):
    """A member (by UUID; the address is context only) left and affected a job. Idempotent by
    ``(job, lost_member_uuid)``: a duplicate delivery finds the row and changes nothing."""

    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="member_loss_incidents", db_constraint=False
    )
    episode = models.ForeignKey(
        RecoveryEpisode,
        null=True,
        on_delete=models.SET_NULL,
        related_name="incidents",
        db_constraint=False,  # see RecoveryEpisode.job
    )
    lost_member_uuid = models.UUIDField()
    lost_address = models.CharField(max_length=255, blank=True, default="")
    classification = models.CharField(max_length=32)
    member_event_sequence = models.BigIntegerField(null=True, blank=True)
    at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "lost_member_uuid"], name="incident_once")
        ]

    def __str__(self) -> str:
        return f"loss of {self.lost_member_uuid} for job {self.job_id}"


class RecoveryAttempt(models.Model):
    """One redeployment of one pipeline within an episode, allocated when its restore is
    prepared (PREPARED) and counted only when the pipeline reaches DEPLOYING on its new slots
    (CONFIRMED). ``attempt_id`` = ``<episodeId>-<pipelineId>-<prepareSequence>``."""

    class State(models.TextChoices):
        PREPARED = "PREPARED"
        CONFIRMED = "CONFIRMED"
        ABORTED = "ABORTED"

    attempt_id = models.CharField(max_length=64, unique=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    episode = models.ForeignKey(RecoveryEpisode, on_delete=models.CASCADE, related_name="attempts")
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="+")
    prepare_sequence = models.IntegerField()
    #: The pipeline restore number this attempt is bound to (Pipeline.restore_count once done).
    restore_number = models.IntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PREPARED)
    prepared_at = models.DateTimeField(db_default=Now())
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["episode", "pipeline", "prepare_sequence"], name="attempt_once"
            )
        ]
        indexes = [models.Index(fields=["pipeline", "restore_number"])]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} ({self.state})"
