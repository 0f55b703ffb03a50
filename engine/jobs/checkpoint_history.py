"""A job's recent checkpoints as an operator reads them: each one's timing and outcome, its size
(the bytes its task groups' snapshots take as stored) and which task group acked when, as
``GET /api/v1/jobs/<id>/checkpoints`` and the job page show them.

A checkpoint's row goes soon after it ends (``checkpoint.max-retained`` keeps a few per
pipeline, the job's running-state cleanup the rest), so each one is recorded as it ends, in the
transaction that ends it: a CheckpointRecord, the newest LIMIT kept per job until history
retention deletes the job. The pending ones are read live, with their acks so far."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from django.db import connection

from engine.models import Checkpoint
from engine.states import CheckpointState

#: Checkpoints shown, and recorded, per job, newest first.
LIMIT = 100

#: A checkpoint ``c``'s acks as ``a.tasks`` (by task group id, acked at in UTC ISO 8601) and
#: their total size as ``a.size_bytes``: one aggregate over its TaskCheckpoint rows.
_ACKS = """
  LEFT JOIN LATERAL (
        SELECT coalesce(sum(t.size_bytes), 0)::bigint AS size_bytes,
               coalesce(jsonb_agg(jsonb_build_object(
                   'taskGroupId', t.task_group_id,
                   'ackedAt', to_char(t.acked_at AT TIME ZONE 'UTC',
                                      'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                   'sizeBytes', t.size_bytes) ORDER BY t.task_group_id), '[]'::jsonb) AS tasks
          FROM engine_taskcheckpoint t
         WHERE t.checkpoint_id = c.id) a ON true
"""

#: Record these checkpoints that have ended (a record is written once).
_RECORD = f"""
INSERT INTO engine_checkpointrecord (job_id, checkpoint_id, pipeline_index, state, triggered_at,
                                     ended_at, size_bytes, failure_reason, tasks)
SELECT c.job_id, c.id, p.index, c.state, c.triggered_at, coalesce(c.ended_at, c.triggered_at),
       a.size_bytes, c.failure_reason, a.tasks
  FROM engine_checkpoint c
  JOIN engine_pipeline p ON p.id = c.pipeline_id
{_ACKS}
 WHERE c.id = ANY(%s::bigint[]) AND c.state <> %s
 ORDER BY c.id
ON CONFLICT (checkpoint_id) DO NOTHING
"""

#: Every record of these jobs older than their newest LIMIT: from the first one beyond, found by
#: the (job, newest) index.
_PRUNE = """
DELETE FROM engine_checkpointrecord r
 USING (SELECT j.id AS job_id,
               (SELECT checkpoint_id FROM engine_checkpointrecord
                 WHERE job_id = j.id ORDER BY checkpoint_id DESC OFFSET %s LIMIT 1) AS beyond
          FROM unnest(%s::bigint[]) AS j(id)) k
 WHERE r.job_id = k.job_id AND r.checkpoint_id <= k.beyond
"""

#: The job's pending checkpoints (live, their acks so far) and its records, newest first: one
#: statement, so a checkpoint ending meanwhile is found once (pending or recorded).
_RECENT = f"""
(SELECT c.id, p.index, c.state, c.triggered_at, c.ended_at, a.size_bytes, c.failure_reason,
        a.tasks
   FROM engine_checkpoint c
   JOIN engine_pipeline p ON p.id = c.pipeline_id
{_ACKS}
  WHERE c.job_id = %(job)s AND c.state = %(pending)s
  ORDER BY c.id DESC LIMIT %(limit)s)
UNION ALL
(SELECT checkpoint_id, pipeline_index, state, triggered_at, ended_at, size_bytes, failure_reason,
        tasks
   FROM engine_checkpointrecord
  WHERE job_id = %(job)s
  ORDER BY checkpoint_id DESC LIMIT %(limit)s)
ORDER BY 1 DESC LIMIT %(limit)s
"""


def record(ended: Iterable[Checkpoint]) -> None:
    """Record these checkpoints, just ended in the caller's transaction, then keep the newest
    LIMIT records of each job touched: two statements however many ended together."""
    ended = list(ended)
    if not ended:
        return
    with connection.cursor() as cur:
        cur.execute(_RECORD, [sorted(c.id for c in ended), CheckpointState.PENDING])
        cur.execute(_PRUNE, [LIMIT, sorted({c.job_id for c in ended})])


def recent(job_id: int, limit: int = LIMIT) -> list[dict]:
    """The job's newest ``limit`` checkpoints, newest first, each with its task groups' acks
    (by task group id) and their total size: one query, the snapshots themselves unread."""
    with connection.cursor() as cur:
        cur.execute(_RECENT, {"job": job_id, "pending": CheckpointState.PENDING, "limit": limit})
        return [_as_dict(*row) for row in cur.fetchall()]


def _as_dict(
    checkpoint_id: int,
    pipeline_index: int,
    state: str,
    triggered: datetime,
    ended: datetime | None,
    size: int,
    failure_reason: str,
    tasks: str | list,
) -> dict:
    tasks = json.loads(tasks) if isinstance(tasks, str) else tasks
    for task in tasks:
        task["ackedAt"] = datetime.fromisoformat(task["ackedAt"])
    return {
        "checkpointId": checkpoint_id,
        "pipelineId": pipeline_index,
        "state": state,
        "triggeredAt": triggered,
        "endedAt": ended,
        "durationMs": None if ended is None else int((ended - triggered).total_seconds() * 1000),
        "sizeBytes": size,
        "failureReason": failure_reason,
        "tasks": tasks,
    }
