"""Who is told that a checkpoint ended without completing (it expired, its job was cancelled,
a task group it expected was redeployed or its pipeline stopped): the attempts it expected that
still run, in Lane A pipelines. A Lane A reader then forgets the snapshot (its checkpoint
callback), its enumerator takes back what that snapshot proved (CHECKPOINT_INCLUDED returns to
APPLIED). Lane B task groups have nothing to take back and are not told (nor, in a rolling
upgrade, is a member that does not know the command). A lost abort costs nothing durable: the
next completed checkpoint settles every inclusion by its own readers' metadata."""

from __future__ import annotations

from collections import defaultdict

from django.db import connection

from engine.jobs.scheduler import Deployment
from engine.models import Checkpoint, TaskGroup
from engine.sourceruntime.choices import Lane
from engine.states import ExecutionStatus

#: The pipelines (of those given) planned in Lane A: their plan's ``sourceRuntime.lane``.
_MANAGED = """
SELECT id FROM engine_pipeline
 WHERE id = ANY(%s) AND plan::json #>> '{sourceRuntime,lane}' = %s
"""


def managed_pipelines(pipeline_ids: set[int]) -> set[int]:
    with connection.cursor() as cur:
        cur.execute(_MANAGED, [sorted(pipeline_ids), Lane.MANAGED.value])
        return {row[0] for row in cur.fetchall()}


def told_of_abort(failed: list[Checkpoint]) -> list[tuple[int, Deployment]]:
    """(checkpoint id, attempt) for each attempt a failed checkpoint of a Lane A pipeline
    expected that is still RUNNING on an alive member, in two queries."""
    managed = managed_pipelines({checkpoint.pipeline_id for checkpoint in failed})
    expected: dict[tuple[int, int], list[int]] = defaultdict(list)
    for checkpoint in (c for c in failed if c.pipeline_id in managed):
        for group_id, attempt in checkpoint.expected.items():
            expected[(int(group_id), attempt)].append(checkpoint.id)
    if not expected:
        return []
    rows = (
        TaskGroup.objects.on_alive_members()
        .filter(id__in={group_id for group_id, _ in expected}, status=ExecutionStatus.RUNNING)
        .order_by("id")
        .values_list(*Deployment.FIELDS)
    )
    return [
        (checkpoint_id, target)
        for target in map(Deployment.of, rows)
        for checkpoint_id in expected.get((target.task_group_id, target.attempt), ())
    ]
