"""What a task group reads of the checkpoints it took part in: the latest completed one, its
own and other task groups' snapshots in it, the completed ones after a point that it acked, and
the record of its commit. Kept apart from the master's coordination (engine.jobs.checkpoints,
which re-exports them)."""

from __future__ import annotations

from django.db.models import QuerySet
from django.db.models.functions import Now

from engine.models import Checkpoint, TaskCheckpoint
from engine.states import CheckpointState


def latest_completed(pipeline_id: int) -> Checkpoint | None:
    return (
        Checkpoint.objects.filter(pipeline_id=pipeline_id, state=CheckpointState.COMPLETED)
        .order_by("-id")
        .first()
    )


def reader_state(checkpoint: Checkpoint, task_group_id: int) -> dict:
    ack = TaskCheckpoint.objects.filter(checkpoint=checkpoint, task_group_id=task_group_id).first()
    return ack.state if ack else {}


def acked_states(checkpoint_id: int, task_group_ids: list[int]) -> dict[int, dict]:
    """What these task groups hold as of a completed checkpoint, by task group id: each one's
    snapshot in it, or, for one that owed no ack (it had FINISHED, its final checkpoint
    before), its newest snapshot in an earlier completed checkpoint."""
    rows = (
        TaskCheckpoint.objects.filter(
            checkpoint_id__lte=checkpoint_id,
            checkpoint__state=CheckpointState.COMPLETED,
            task_group_id__in=task_group_ids,
        )
        .order_by("task_group_id", "-checkpoint_id")
        .distinct("task_group_id")
        .values_list("task_group_id", "state")
    )
    return dict(rows)


def acked_after(task_group_id: int, attempt: int, after: int) -> QuerySet[TaskCheckpoint]:
    """This attempt's acks of COMPLETED checkpoints after ``after``, newest first."""
    return TaskCheckpoint.objects.filter(
        checkpoint_id__gt=after,
        checkpoint__state=CheckpointState.COMPLETED,
        task_group_id=task_group_id,
        attempt=attempt,
    ).order_by("-checkpoint_id")


def completed_since(task_group_id: int, attempt: int, after: int) -> tuple[int, dict] | None:
    """The newest COMPLETED checkpoint after ``after`` that this attempt acked, and its
    snapshot: what its sinks must commit (committing it commits every earlier one too)."""
    return acked_after(task_group_id, attempt, after).values_list("checkpoint_id", "state").first()


def record_commit(checkpoint_id: int, task_group_id: int, attempt: int) -> None:
    """The task group committed its sinks' state for ``checkpoint_id`` (and every earlier)."""
    TaskCheckpoint.objects.filter(
        checkpoint_id=checkpoint_id, task_group_id=task_group_id, attempt=attempt
    ).update(committed_at=Now())
