"""What a Lane A enumerator reads of its readers' checkpoints: only the runtime metadata that
proves which assignments a snapshot includes (attempt lineage and applied sender watermarks,
and for a restore the recent assignments), never the readers' whole state (their connector
state and sinks' pre-commit states). The snapshots are JSON text: PostgreSQL extracts the keys,
so neither the rest nor its parsing reaches the worker."""

from __future__ import annotations

import json

from django.db import connection

from engine.jobs import checkpoints
from engine.states import CheckpointState

#: The metadata keys a proof needs; a restore also reads ``recentAssignments``.
PROOF_KEYS = ("metadataVersion", "readerAttemptLineage", "appliedSenderWatermarks")

_METADATA = """
SELECT DISTINCT ON (t.task_group_id) t.task_group_id, {columns}
  FROM engine_taskcheckpoint t
  JOIN engine_checkpoint c ON c.id = t.checkpoint_id
 CROSS JOIN LATERAL (SELECT t.state::json #> '{{managed,metadata}}' AS m) x
 WHERE t.checkpoint_id <= %s AND c.state = %s AND t.task_group_id = ANY(%s)
 ORDER BY t.task_group_id, t.checkpoint_id DESC
"""


def acked_metadata(
    checkpoint_id: int, task_group_ids: list[int], recent: bool = False
) -> dict[int, dict | None]:
    """By task group: the metadata keys a proof needs (with ``recentAssignments`` when
    ``recent``) of its snapshot in checkpoint ``checkpoint_id``, or, for one that owed no ack
    (it had FINISHED), of its newest snapshot in an earlier completed checkpoint, as
    ``checkpoints.acked_states`` finds them. None: a snapshot without runtime metadata."""
    keys = (*PROOF_KEYS, "recentAssignments") if recent else PROOF_KEYS
    columns = ", ".join("(x.m -> %s::text)::text" for _ in keys)
    with connection.cursor() as cur:
        cur.execute(
            _METADATA.format(columns=columns),
            [*keys, checkpoint_id, CheckpointState.COMPLETED, list(task_group_ids)],
        )
        rows = cur.fetchall()
    out: dict[int, dict | None] = {}
    for group_id, *values in rows:
        found = {key: json.loads(v) for key, v in zip(keys, values, strict=True) if v is not None}
        out[group_id] = found or None
    return out


def newest_completed(task_group_id: int, attempt: int, after: int) -> int | None:
    """The newest COMPLETED checkpoint after ``after`` that this attempt acked: its id only
    (``checkpoints.completed_since`` reads its snapshot too)."""
    acks = checkpoints.acked_after(task_group_id, attempt, after)
    return acks.values_list("checkpoint_id", flat=True).first()
