"""Finished-job history: what stays readable about a job after it ends."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class JobHistory(models.Model):
    """The finished-job record, written in the job's terminal transaction.

    ``dirty_task`` is the dirty-job summary at the end (engine.dirty), or null for a job that did
    not track it; ``episodes`` its bounded recent recovery episodes. A job finished before this
    record existed has no row at all, and reads as tracking DISABLED.
    """

    job = models.OneToOneField(
        "engine.Job", primary_key=True, on_delete=models.CASCADE, related_name="history"
    )
    status = models.CharField(max_length=16)
    finished_at = models.DateTimeField(db_default=Now())
    dirty_task = models.JSONField(null=True, blank=True)
    episodes = models.JSONField(default=list, blank=True)
    #: Pipelines, task groups, metrics and checkpoints as the API showed them at the end
    #: (engine.jobs.summary): the job's detail reads from here once its running state is gone.
    summary = models.JSONField(null=True, blank=True)
    error_msg = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return f"history of job {self.job_id} ({self.status})"
