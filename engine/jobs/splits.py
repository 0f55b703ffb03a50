"""Split assignments: the enumerator assigns a pipeline's splits to its readers, each reader
records how far it has read, and a restore puts them back at a checkpoint's positions.

A reader's writes are fenced by its attempt and member in the statement itself: a REMOVED
member woken from a freeze, or an attempt the master replaced, changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Exists

from engine.models import Pipeline, SplitAssignment, TaskGroup


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
