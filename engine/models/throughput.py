"""Throughput samples: what the dashboard's sparklines draw."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class ThroughputSample(models.Model):
    """A running job's rows/s (the sum over its running task groups) at one moment. The active
    master writes one per running job every few seconds, in one statement, and keeps the last
    ten minutes (engine.jobs.throughput)."""

    job = models.ForeignKey("engine.Job", on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField(db_default=Now())
    rows_per_second = models.FloatField()

    class Meta:
        indexes = [models.Index(fields=["job", "at"]), models.Index(fields=["at"])]

    def __str__(self) -> str:
        return f"job {self.job_id} at {self.at}: {self.rows_per_second:.1f} rows/s"
