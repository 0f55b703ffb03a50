"""Split assignments: the enumerator assigns a pipeline's splits to its readers, each reader
records how far it has read, and a restore puts them back at a checkpoint's positions.

A reader's writes are fenced by its attempt and member in the statement itself: a REMOVED
member woken from a freeze, or an attempt the master replaced, changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import Exists

from engine.models import Pipeline, SplitAssignment, TaskGroup
from engine.states import EXECUTION_LIVE, MemberState


@dataclass(frozen=True)
class Reader:
    """The attempt of a reader task group on its member: whose writes these are."""

    task_group_id: int
    attempt: int
    member_id: int

    def owns(self) -> Exists:
        return Exists(
            TaskGroup.objects.live()
            .on_alive_members()
            .filter(id=self.task_group_id, attempt=self.attempt, member_id=self.member_id)
        )


def assign(pipeline_id: int, splits: list[dict], readers: int, owned: Callable[[], bool]) -> bool:
    """Give the splits to the readers round-robin, once (a redelivered assignment changes
    nothing); False, and nothing written, unless ``owned()`` says the enumerator still owns
    its task group inside the transaction."""
    with transaction.atomic():
        if not owned():
            return False
        SplitAssignment.objects.bulk_create(
            [
                SplitAssignment(
                    pipeline_id=pipeline_id,
                    split_id=split["splitId"],
                    split=split,
                    reader_index=i % readers,
                )
                for i, split in enumerate(splits)
            ],
            ignore_conflicts=True,
        )
        Pipeline.objects.filter(id=pipeline_id).update(splits_assigned=True)
    return True


def assigned(pipeline_id: int) -> bool:
    return Pipeline.objects.filter(id=pipeline_id, splits_assigned=True).exists()


def unread(pipeline_id: int, reader_index: int) -> list[dict]:
    """The reader's splits not read to the end: ``[{splitId, split, offset}]``, in order."""
    return [
        {"splitId": a.split_id, "split": a.split, "offset": a.offset}
        for a in SplitAssignment.objects.filter(
            pipeline_id=pipeline_id, reader_index=reader_index, done=False
        ).order_by("id")
    ]


def record_offsets(reader: Reader, pipeline_id: int, offsets: dict[str, int]) -> bool:
    """How far ``reader`` has read; False (nothing written) if the attempt is not current."""
    written = True
    for split_id, offset in offsets.items():
        written = (
            SplitAssignment.objects.filter(pipeline_id=pipeline_id, split_id=split_id)
            .filter(reader.owns())
            .update(offset=offset)
            == 1
        ) and written
    return written


#: A reader's progress in one statement: its metrics on its task group, its offsets on its
#: splits, both only while the attempt is current on a live member (``Reader.owns``).
_PROGRESS = """
WITH owned AS (
    UPDATE engine_taskgroup SET source_received = %(received)s, sink_written = %(written)s,
           source_received_bytes = %(received_bytes)s, sink_written_bytes = %(written_bytes)s,
           rows_per_second = %(rate)s, busy_seconds = %(busy)s, blocked_seconds = %(blocked)s,
           updated_at = now()
    WHERE id = %(group)s AND attempt = %(attempt)s AND member_id = %(member)s
      AND status = ANY(%(live)s)
      AND EXISTS (SELECT 1 FROM engine_member WHERE id = %(member)s AND state = %(alive)s)
    RETURNING id
), moved AS (
    UPDATE engine_splitassignment AS s SET "offset" = v.position
    FROM unnest(%(splits)s::text[], %(offsets)s::bigint[]) AS v (split_id, position)
    WHERE s.pipeline_id = %(pipeline)s AND s.split_id = v.split_id
      AND EXISTS (SELECT 1 FROM owned)
    RETURNING s.id
)
SELECT EXISTS (SELECT 1 FROM owned)
"""
_LIVE = sorted(str(status) for status in EXECUTION_LIVE)


def record_progress(
    reader: Reader,
    pipeline_id: int,
    received: int,
    written: int,
    rows_per_second: float,
    offsets: dict[str, int],
    received_bytes: int = 0,
    written_bytes: int = 0,
    busy_seconds: float = 0.0,
    blocked_seconds: float = 0.0,
) -> bool:
    """A reader's hot path once a second: its counts, its times so far (busy, and blocked on
    its sinks: its back-pressure) and how far it has read, one round trip (no event, no job
    lock). False, and nothing written, if the attempt is not current."""
    with connection.cursor() as cur:
        cur.execute(
            _PROGRESS,
            {
                "received": received,
                "written": written,
                "received_bytes": received_bytes,
                "written_bytes": written_bytes,
                "rate": rows_per_second,
                "busy": busy_seconds,
                "blocked": blocked_seconds,
                "group": reader.task_group_id,
                "attempt": reader.attempt,
                "member": reader.member_id,
                "live": _LIVE,
                "alive": str(MemberState.ALIVE),
                "splits": list(offsets),
                "offsets": list(offsets.values()),
                "pipeline": pipeline_id,
            },
        )
        return cur.fetchone()[0]


def mark_done(reader: Reader, pipeline_id: int, split_id: str, offset: int) -> bool:
    return (
        SplitAssignment.objects.filter(pipeline_id=pipeline_id, split_id=split_id)
        .filter(reader.owns())
        .update(offset=offset, done=True)
        == 1
    )


def rewind(pipeline_id: int, positions: dict[str, dict]) -> None:
    """Put splits back at ``{splitId: {offset, done}}`` (a checkpoint's reader positions)."""
    for split_id, position in positions.items():
        SplitAssignment.objects.filter(pipeline_id=pipeline_id, split_id=split_id).update(
            offset=position["offset"], done=position["done"]
        )


def forget(pipeline_id: int) -> None:
    """No checkpoint to restore from: the enumerator assigns every split again."""
    SplitAssignment.objects.filter(pipeline_id=pipeline_id).delete()
