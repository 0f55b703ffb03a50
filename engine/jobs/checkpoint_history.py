"""A job's recent checkpoints as an operator reads them: each one's timing and outcome, its size
(the bytes its task groups' snapshots take as stored) and which task group acked when, as
``GET /api/v1/jobs/<id>/checkpoints`` and the job page show them."""

from __future__ import annotations

from collections import defaultdict

from engine.models import Checkpoint, TaskCheckpoint

#: Checkpoints shown per job, newest first.
LIMIT = 100


def recent(job_id: int, limit: int = LIMIT) -> list[dict]:
    """The job's newest ``limit`` checkpoints, newest first, each with its task groups' acks
    (by task group id) and their total size: two queries, the snapshots themselves unread."""
    checkpoints = list(
        Checkpoint.objects.filter(job_id=job_id)
        .order_by("-id")
        .values("id", "pipeline__index", "state", "triggered_at", "ended_at", "failure_reason")[
            :limit
        ]
    )
    tasks: dict[int, list[dict]] = defaultdict(list)
    for checkpoint_id, group_id, acked_at, size in (
        TaskCheckpoint.objects.filter(checkpoint_id__in=[c["id"] for c in checkpoints])
        .order_by("checkpoint_id", "task_group_id")
        .values_list("checkpoint_id", "task_group_id", "acked_at", "size_bytes")
    ):
        tasks[checkpoint_id].append(
            {"taskGroupId": group_id, "ackedAt": acked_at, "sizeBytes": size}
        )
    return [_as_dict(c, tasks[c["id"]]) for c in checkpoints]


def _as_dict(checkpoint: dict, tasks: list[dict]) -> dict:
    triggered, ended = checkpoint["triggered_at"], checkpoint["ended_at"]
    return {
        "checkpointId": checkpoint["id"],
        "pipelineId": checkpoint["pipeline__index"],
        "state": checkpoint["state"],
        "triggeredAt": triggered,
        "endedAt": ended,
        "durationMs": None if ended is None else int((ended - triggered).total_seconds() * 1000),
        "sizeBytes": sum(task["sizeBytes"] for task in tasks),
        "failureReason": checkpoint["failure_reason"],
        "tasks": tasks,
    }
