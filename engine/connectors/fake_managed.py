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
#: Rows of a split built at once and handed out over the next poll turns (a block): a turn's
#: rows then cost nothing to build, building is as batched as Lane B's reads (the data plane's
#: batch size), and a step's turns (64 of 64 rows) hand a whole block over uncopied. A reader
#: holds one block at a time, as a Lane B reader holds one batch.
READ_AHEAD = 4096


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
        #: The rows each split holds (None: an ``endless`` split never ends), by split id. A
        #: STREAMING reader whose splits have ended says NOTHING_AVAILABLE and idles.
        self.limits: dict[str, int | None] = {}
        self._order: list[str] | None = None  # the splits in id order, kept between turns
        #: The block built ahead (split id, first offset, rows, end offset), one at a time;
        #: derived, never checkpointed. Its split is the current one until the block is out.
        self._block: tuple[str, int, list[tuple], int] | None = None

    def add_splits(self, splits: list[dict]) -> None:
        super().add_splits(splits)
        self._order = None

    def limit(self, split_id: str) -> int | None:
        """The rows the split holds (its own count: splits differ when ``split.num`` does not
        divide ``row.num``), looked up once."""
        if split_id not in self.limits:
            self.limits[split_id] = self.source.split_rows(self.splits[split_id], self.mode)
        return self.limits[split_id]

    def restore(self, state: dict) -> None:
        super().restore(state)
        self._order = None
        self._block = None
        self.limits.clear()
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
        """Rows from the splits in turn, each split's offset advanced with them.

        In the steady state (no pacing, a turn's records within its byte budget) the splits
        take turns a block at a time: the current split's next READ_AHEAD rows are built at
        once, as Lane B reads a batch, go out as a run of whole turns, and end the step when
        they are all out, so a step hands over one whole block, uncopied; then the next split.
        Otherwise (``_poll``) each turn starts with the split after the one the last turn
        ended in, its rows built as they come due."""
        if self._order is None:
            self._order = sorted(self.offsets)
        order, limits = self._order, context.limits
        if order and not self.paced and limits.max_records * ROW_BYTES <= limits.max_bytes:
            status = self._run_block(context, order)
            if status is not None:
                return status
        return self._poll(context, order)

    def _run_block(self, context: PollContext, order: list[str]) -> PollStatus | None:
        """The current split's block (built now if need be) as a run of whole turns, splits
        that have ended passed over; None when every split has ended (or the rows are
        listed): the general path then says so."""
        if self.listed is not None:
            return None
        block = self._block
        if block is not None and block[1] <= self.offsets[block[0]] < block[3]:
            split_id, first, rows, end = block  # the current split's, until it is out
            offset = self.offsets[split_id]
        else:
            n = len(order)
            for _ in range(n):
                split_id = order[self.cursor % n]
                offset, limit = self.offsets[split_id], self.limit(split_id)
                if limit is None or offset < limit:
                    break
                self.cursor = (self.cursor + 1) % n
            else:
                return None
            end = offset + READ_AHEAD if limit is None else min(offset + READ_AHEAD, limit)
            ids = self.source.row_ids(self.splits[split_id], self.mode, offset, end)
            first, rows = offset, self.build(ids)
            self._block = (split_id, first, rows, end)  # one at a time, as a Lane B batch
        offset += context.emit_turns(rows, offset - first, end - first, ROW_BYTES)
        self.offsets[split_id] = offset  # advanced with the rows, before the call returns
        if offset == end:  # the block is out: the next split's, in a step of its own
            self._block = None
            self.cursor = (order.index(split_id) + 1) % len(order)
            context.end_step()
        return PollStatus.MORE_AVAILABLE

    def _poll(self, context: PollContext, order: list[str]) -> PollStatus:
        """Any turn: pacing, split ends, budgets, and rows built as they are needed."""
        now = self.clock() if self.paced else 0.0
        self.retry_at = None
        for turn in range(len(order)):
            split_id = order[(self.cursor + turn) % len(order)]
            offset, limit = self.offsets[split_id], self.limit(split_id)
            if limit is not None and offset >= limit:
                continue
            due = self._due(split_id, offset, now) if self.paced else None
            if due == 0:
                continue
            while limit is None or offset < limit:
                room = (context.limits.max_bytes - context.bytes) // ROW_BYTES
                room = min(context.remaining_records, room if context.count else max(room, 1))
                if due is not None:
                    room = min(room, due)
                if room <= 0:  # the byte budget is spent (a turn always makes progress)
                    self.cursor = (self.cursor + turn) % len(order)
                    return PollStatus.MORE_AVAILABLE
                stop = offset + room if limit is None else min(offset + room, limit)
                self._emit(context, split_id, offset, stop)
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

    def _emit(self, context: PollContext, split_id: str, start: int, stop: int) -> None:
        """The split's rows ``[start, stop)``, built for this turn alone: the general path is
        for paced sources (a turn takes only what is due), listed rows, byte budgets below a
        turn's rows, and the end of the input. A block held meanwhile stays keyed by its
        split's offset, so it is used only for rows not emitted yet."""
        if self.listed is not None:
            context.emit_many(self.listed[start:stop], ROW_BYTES)
            return
        ids = self.source.row_ids(self.splits[split_id], self.mode, start, stop)
        context.emit_many(self.build(ids), ROW_BYTES)
