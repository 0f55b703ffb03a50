"""The checkpoint-visible state most managed readers keep (``SplitOffsets``): their splits by id
and how far each was read, snapshotted as the connector state of version ``STATE_VERSION``."""

from __future__ import annotations

from engine.sourceruntime.watchdog import Wakeup


class SplitOffsets:
    """The checkpoint-visible state most managed readers keep: their splits by id and how far
    each was read. Assignments are idempotent (a split assigned twice is read once). A poll
    never blocks; ``wakeup()`` sets ``wake``, which ends the poll call in progress at its next
    turn or record boundary (the event loop clears it as the next call starts)."""

    STATE_VERSION = 1

    def __init__(self) -> None:
        self.wake = Wakeup()
        self.splits: dict[str, dict] = {}
        self.offsets: dict[str, int] = {}
        self.no_more_splits = False
        self.cursor = 0  # where the next poll turn starts, among the splits in id order

    def add_splits(self, splits: list[dict]) -> None:
        for split in splits:
            self.splits.setdefault(split["splitId"], split)
            self.offsets.setdefault(split["splitId"], 0)

    def notify_no_more_splits(self) -> None:
        self.no_more_splits = True

    def snapshot(self) -> dict:
        return {"splits": list(self.splits.values()), "offsets": dict(self.offsets)}

    def restore(self, state: dict) -> None:
        self.splits = {s["splitId"]: s for s in state["splits"]}
        self.offsets = dict(state["offsets"])

    def wakeup(self) -> None:
        self.wake.woken = True
