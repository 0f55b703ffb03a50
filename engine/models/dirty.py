"""Dirty-job (recovery-degraded) tracking state: per-job state, gaps, episodes, incidents and
attempts (engine.dirty)."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from engine.states import AttemptState, EpisodeStatus

from .jobs import Job, Pipeline


class DirtyJobState(models.Model):
    """The running dirty-job (recovery-degraded) state of one tracking-enabled job.

    Created in the job's submit transaction, so an enabled job is never schedulable without it;
    every change takes this row's lock (after the job row's, where both are taken) in one short
    transaction with its EngineEvent. Deleted in the job's terminal transaction, with its summary
    frozen into the finished-job record (history.JobHistory, engine.dirty.history); if that
    record fails, it stays until the record is written. See engine.dirty.
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
    #: The last operator acknowledgement of an UNKNOWN evaluation (engine.dirty.acknowledge).
    acknowledged_by = models.CharField(max_length=150, blank=True, default="")
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_reason = models.CharField(max_length=500, blank=True, default="")
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

    #: No database constraint on the references written by a member loss (here, the incident's
    #: and the state's): each check takes a FOR KEY SHARE row lock, a WAL-logged write, and they
    #: were a third of a member removal's cost with 1,000 jobs (bench/member_loss). engine.dirty
    #: is their only writer, under the job's state-row lock; deletes go through the ORM, which
    #: applies on_delete (ADR 0007).
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="recovery_episodes", db_constraint=False
    )
    status = models.CharField(
        max_length=16, choices=EpisodeStatus.choices, default=EpisodeStatus.ACTIVE
    )
    classification = models.CharField(max_length=32)
    #: The job-level generation: the highest confirmed prepare sequence of any pipeline.
    generation = models.IntegerField(default=0)
    #: The part of ``generation`` counted in the job's recoveryAttemptCount: an episode made of
    #: PLANNED_VERIFIED incidents alone counts nothing; once an UNCLASSIFIED incident joins it,
    #: its next confirmation counts every generation not counted yet.
    counted_generation = models.IntegerField(default=0, db_default=0)
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
        Job,
        on_delete=models.CASCADE,
        related_name="member_loss_incidents",
        db_constraint=False,
        db_index=False,  # incident_once (job, lost_member_uuid) serves lookups by job
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

    attempt_id = models.CharField(max_length=64, unique=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    episode = models.ForeignKey(RecoveryEpisode, on_delete=models.CASCADE, related_name="attempts")
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="+")
    prepare_sequence = models.IntegerField()
    #: The pipeline restore number this attempt is bound to (Pipeline.restore_count once done).
    restore_number = models.IntegerField()
    state = models.CharField(
        max_length=16, choices=AttemptState.choices, default=AttemptState.PREPARED
    )
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
