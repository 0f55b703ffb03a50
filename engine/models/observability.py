"""What the job page shows beyond state: each failure of a task group with its traceback, the
task groups' log lines and the ended checkpoints, kept in PostgreSQL (any web process shows any
worker's) and bounded per job or task group (engine.jobs.exceptions, engine.member.tasklogs,
engine.jobs.checkpoint_history)."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from engine.states import CheckpointState

from .cluster import Member
from .jobs import Job


class JobException(models.Model):
    """One failure of a task group attempt: reported by its worker (error and traceback) or
    recorded by the master when the worker was lost. The newest few are kept per job."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="exceptions")
    at = models.DateTimeField(db_default=Now())
    #: Not foreign keys: the task group rows go with the job's running state, its failures
    #: stay (the newest few, with the job) for the finished job's page.
    task_group_id = models.BigIntegerField(null=True, blank=True)
    #: What the task group was, e.g. ``reader 0``.
    task_group_label = models.CharField(max_length=64, blank=True, default="")
    pipeline_index = models.IntegerField(null=True, blank=True)
    attempt = models.IntegerField()
    member = models.ForeignKey(
        Member, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: The member's name when it failed (kept if the member row goes).
    member_name = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    #: The attempt failed because its member was lost (not by an error of its own).
    member_lost = models.BooleanField(default=False)
    #: The failure made the master restore the pipeline (rather than fail the job).
    caused_restore = models.BooleanField(default=False)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["job", "-id"], name="jobexception_job_newest")]

    def __str__(self) -> str:
        return f"failure of task group {self.task_group_id} attempt {self.attempt}"


class TaskLogLine(models.Model):
    """A log line a task group's thread wrote on its worker, shipped in batches; the newest
    few per task group are kept (``engine.logs.lines-per-task-group``)."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    #: Not a foreign key: the task group rows go with the job's running state, its lines stay
    #: (with the job, until history retention deletes it) for the finished job's page.
    task_group_id = models.BigIntegerField()
    attempt = models.IntegerField()
    at = models.DateTimeField()
    #: The ``logging`` level number (20 INFO, 30 WARNING, ...).
    level = models.SmallIntegerField()
    logger = models.CharField(max_length=200, blank=True, default="")
    message = models.TextField()

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["job", "id"], name="tasklog_job_id"),
            models.Index(fields=["task_group_id", "id"], name="tasklog_taskgroup_id"),
        ]

    def __str__(self) -> str:
        return f"task group {self.task_group_id}: {self.message[:40]}"


class CheckpointRecord(models.Model):
    """An ended checkpoint as its job's history shows it: written as it ends, so it outlives
    ``checkpoint.max-retained`` and the job's running-state cleanup (the newest few per job
    are kept, until history retention deletes the job)."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    #: The checkpoint's id (not a foreign key: its row goes long before this one).
    checkpoint_id = models.BigIntegerField(unique=True)
    pipeline_index = models.IntegerField()
    state = models.CharField(max_length=16, choices=CheckpointState.choices)
    triggered_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    #: The sum of its task groups' snapshot sizes as stored.
    size_bytes = models.BigIntegerField(default=0)
    failure_reason = models.TextField(blank=True, default="")
    #: Its acks by task group id: ``[{taskGroupId, ackedAt (ISO 8601), sizeBytes}, ...]``.
    tasks = models.JSONField(default=list)

    class Meta:
        ordering = ["-checkpoint_id"]
        indexes = [
            models.Index(fields=["job", "-checkpoint_id"], name="checkpointrecord_job_newest")
        ]

    def __str__(self) -> str:
        return f"record of checkpoint {self.checkpoint_id} ({self.state})"
