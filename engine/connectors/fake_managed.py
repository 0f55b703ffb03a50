"""FakeSource's managed reader: the same deterministic rows, read as Lane A reads (bounded,
non-blocking poll turns that emit rows and advance their split's offset together).

Pacing (``rows.per-second``, ``split.read-interval``) never blocks a turn: a split whose next
rows are not due is passed over, and a reader with nothing due says when it will have more
(``retry_at``), which the event loop keeps as its own availability timer.
"""

from __future__ import annotations

import time

from engine.connectors.fake import FakeSource, row_builder
from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.reader import PollContext, SplitOffsets
from engine.states import JobMode

CAPABILITY = FakeSource.managed_capability
#: What one row of FakeSource costs in a poll turn's byte budget (an estimate: rows are tuples).
ROW_BYTES = 64


class ManagedFakeReader(SplitOffsets):
    def __init__(self, source: FakeSource, mode: str = JobMode.BATCH, clock=time.monotonic) -> None:
        super().__init__()
        self.source, self.mode, self.clock = source, mode, clock
        self.build = row_builder(source.output_schema(), source.sizes())
        self.listed = source.listed_rows()
        self.rate = source.config.get("rows.per-second") or 0.0
        self.interval = (source.config.get("split.read-interval") or 0) / 1000
        #: Pacing, per split in this attempt: (started, offset then), and the next read's time.
        self._paced: dict[str, tuple[float, int]] = {}
        self._next_read: dict[str, float] = {}
        self.retry_at: float | None = None
        self.paced = bool(self.rate or self.interval)
        #: The rows a split holds (None: a STREAMING split never ends).
        self.limit = None if mode == JobMode.STREAMING else source.config["row.num"]
        if self.listed is not None:
            self.limit = len(self.listed)  # the same rows from every split, then it ends
        self._order: list[str] | None = None  # the splits in id order, kept between turns

    def add_splits(self, splits: list[dict]) -> None:
        super().add_splits(splits)
        self._order = None

    def restore(self, state: dict) -> None:
        super().restore(state)
        self._order = None
        self._paced.clear()
        self._next_read.clear()

    def _due(self, split_id: str, offset: int, now: float) -> int | None:
        """How many rows of the split may be read now (None: no pacing); 0 records when."""
        allowed = None
        if self.interval:
            at = self._next_read.get(split_id, 0.0)
            if at > now:
                self._later(at)
                return 0
        if self.rate > 0:
            started, first = self._paced.setdefault(split_id, (now, offset))
            produced = offset - first
            allowed = int((now - started) * self.rate) + 1 - produced
            if allowed <= 0:
                self._later(started + produced / self.rate)
                return 0
        return allowed

    def _later(self, at: float) -> None:
        self.retry_at = at if self.retry_at is None else min(self.retry_at, at)

    def poll(self, context: PollContext) -> PollStatus:
        """Rows from the splits in turn (each turn starts with the split after the one the
        last turn ended in, so no split starves), each split's offset advanced with them."""
        limit = self.limit
        if self._order is None:
            self._order = sorted(self.offsets)
        order = self._order
        now = self.clock() if self.paced else 0.0
        self.retry_at = None
        for turn in range(len(order)):
            split_id = order[(self.cursor + turn) % len(order)]
            offset = self.offsets[split_id]
            if limit is not None and offset >= limit:
                continue
            due = self._due(split_id, offset, now) if self.paced else None
            if due == 0:
                continue
            while limit is None or offset < limit:
                room = (context.limits.max_bytes - context.bytes) // ROW_BYTES
                room = min(context.remaining_records, room if context.records else max(room, 1))
                if due is not None:
                    room = min(room, due)
                if room <= 0:  # the byte budget is spent (a turn always makes progress)
                    self.cursor = (self.cursor + turn) % len(order)
                    return PollStatus.MORE_AVAILABLE
                stop = offset + room if limit is None else min(offset + room, limit)
                context.emit_many(self._rows(split_id, offset, stop), ROW_BYTES)
                if due is not None:
                    due -= stop - offset
                offset = stop
                self.offsets[split_id] = offset  # advanced with the rows, in the same turn
                if self.interval:
                    self._next_read[split_id] = now + self.interval
                if context.should_yield() or due == 0 or self.interval:
                    self.cursor = (self.cursor + turn + 1) % len(order)
                    return PollStatus.MORE_AVAILABLE
        if self.no_more_splits and self.mode == JobMode.BATCH and self.retry_at is None:
            return PollStatus.END_OF_INPUT
        return PollStatus.NOTHING_AVAILABLE

    def _rows(self, split_id: str, start: int, stop: int) -> list[tuple]:
        if self.listed is not None:
            return self.listed[start:stop]
        return self.build(self.source.row_ids(self.splits[split_id], self.mode, start, stop))
