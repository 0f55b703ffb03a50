"""Cleanup records: the durable intent to remove what a finished job leaves behind."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from engine.states import CleanupKind, CleanupState


class JobCleanupRecord(models.Model):
    """Written in the job's terminal transaction (JOB_STATE), or when that one is done
    (HISTORY); executed at ``due_at`` by the control queue, swept by the active master so a
    lost message or a dead master never orphans it. The job is named by id (and name), not by
    a foreign key: a HISTORY record outlives the job it removes."""

    job_id = models.BigIntegerField()
    job_name = models.CharField(max_length=200, blank=True, default="")
    kind = models.CharField(max_length=16, choices=CleanupKind.choices)
    state = models.CharField(
        max_length=16, choices=CleanupState.choices, default=CleanupState.PENDING
    )
    due_at = models.DateTimeField()
    created_at = models.DateTimeField(db_default=Now())
    #: When the active master last put it on the control queue (sent again if not DONE soon;
    #: a waiting record's is set back so that the sweep sends it again after its wait).
    enqueued_at = models.DateTimeField(null=True, blank=True)
    executed_at = models.DateTimeField(null=True, blank=True)
    #: Executions tried (failed ones included, waits for the job's history not); ``executions``:
    #: those that removed something (never more than one: the proof that duplicates and racing
    #: sweepers change nothing).
    attempts = models.IntegerField(default=0)
    executions = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-due_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["job_id", "kind"], name="cleanup_once_per_job_kind")
        ]
        indexes = [models.Index(fields=["state", "due_at"]), models.Index(fields=["job_id"])]

    def __str__(self) -> str:
        return f"{self.kind} cleanup of job {self.job_id} ({self.state})"
