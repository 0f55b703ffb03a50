"""Checkpoints and the task groups' snapshots at their barriers."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from engine.states import CheckpointState

from .fields import OrderedJSONField
from .jobs import Job, Pipeline, TaskGroup


class Checkpoint(models.Model):
    """Checkpoint N of a pipeline. Ids come from one sequence: they only grow, whoever leads."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="checkpoints")
    state = models.CharField(
        max_length=16, choices=CheckpointState.choices, default=CheckpointState.PENDING
    )
    #: {task group id: attempt} the barrier went to; acks of other attempts do not count.
    expected = models.JSONField(default=dict)
    triggered_at = models.DateTimeField(db_default=Now())
    #: The epoch of the master that last sent the barriers, and when: a checkpoint another
    #: master triggered (it may have died before they went out) has them sent again at once.
    barrier_epoch = models.IntegerField(null=True, blank=True)
    barriers_sent_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    failure_reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["pipeline", "state", "id"]), models.Index(fields=["state"])]

    def __str__(self) -> str:
        return f"checkpoint {self.id} of pipeline {self.pipeline_id} ({self.state})"


class TaskCheckpoint(models.Model):
    """One task group's snapshot at a barrier: reader positions and sink pre-commit states."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="acks")
    task_group = models.ForeignKey(TaskGroup, on_delete=models.CASCADE, related_name="+")
    attempt = models.IntegerField()
    state = OrderedJSONField()
    acked_at = models.DateTimeField(db_default=Now())
    #: The size of ``state`` as stored (its JSON text, in bytes).
    size_bytes = models.BigIntegerField(default=0, db_default=0)
    #: When the task group committed its sinks' state for this (completed) checkpoint.
    committed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "task_group"], name="ack_once")
        ]

    def __str__(self) -> str:
        return f"ack of {self.task_group_id} for checkpoint {self.checkpoint_id}"
