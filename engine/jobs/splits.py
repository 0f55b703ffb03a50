"""Split assignments: the enumerator assigns a pipeline's splits to its readers, each reader
records how far it has read, and a restore puts them back at a checkpoint's positions."""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from engine.models import Pipeline, SplitAssignment


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


def record_offsets(pipeline_id: int, offsets: dict[str, int]) -> None:
    for split_id, offset in offsets.items():
        SplitAssignment.objects.filter(pipeline_id=pipeline_id, split_id=split_id).update(
            offset=offset
        )


def mark_done(pipeline_id: int, split_id: str, offset: int) -> None:
    SplitAssignment.objects.filter(pipeline_id=pipeline_id, split_id=split_id).update(
        offset=offset, done=True
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
