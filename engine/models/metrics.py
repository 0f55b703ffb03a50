"""Monotonic totals behind the Prometheus counters (engine.counters, engine.metrics)."""

from __future__ import annotations

from django.db import models


class MetricTotal(models.Model):
    """A running total, raised in the transaction of what it counts (never lowered).

    What the engine's rows cannot say once they are gone lives here: checkpoints ended and
    their durations, restores, recovery attempts counted, DIRTY transitions, and the rows read
    and written by task-group attempts that were redeployed or cleaned up. ``shard`` spreads
    concurrent writers over a few rows (a reader sums them), so no two transactions wait on
    one hot row.
    """

    name = models.CharField(max_length=64)
    label = models.CharField(max_length=64, blank=True, default="")
    shard = models.SmallIntegerField(default=0)
    value = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "label", "shard"], name="metric_total_key")
        ]

    def __str__(self) -> str:
        return f"{self.name}{{{self.label}}}[{self.shard}] = {self.value}"
