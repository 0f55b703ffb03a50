"""FakeSource's managed reader: the same deterministic rows, read as Lane A reads (bounded,
non-blocking poll turns that emit records and advance their split's offset together). In the
steady state its turns are cut from blocks of Arrow columns built as Lane B builds its batches;
paced splits and listed rows go out as rows, a turn's at a time.

Pacing (``rows.per-second``, ``split.read-interval``) never blocks a turn: a split whose next
rows are not due is passed over, and a reader with nothing due says when it will have more
(``retry_at``): its ``is_available()`` future is completed then by a timer on the worker's
shared timers (engine.sourceruntime.timers), which the event loop receives as an AVAILABLE
command (engine.sourceruntime.availability). Nothing in a turn
waits, so ``wakeup()`` (``SplitOffsets``'s) only ends the poll call in progress early: a run of
turns out of a block stops after the turn in progress, the general path after its rows so far.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, InvalidStateError

import pyarrow as pa

from engine.connectors.arrowrows import arrow_schema
from engine.connectors.batches import from_rows
from engine.connectors.batches import limits as batch_limits
from engine.connectors.fake import FakeSource
from engine.connectors.fake_values import column_builder, row_builder
from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.reader import PollContext, SplitOffsets
from engine.sourceruntime.timers import Timer, timers
from engine.states import JobMode

CAPABILITY = FakeSource.managed_capability
#: What one row of FakeSource costs in a poll turn's byte budget when it goes out as a tuple (an
#: estimate); a block's rows cost what its Arrow buffers hold (``row_bytes``).
ROW_BYTES = 64


class ManagedFakeReader(SplitOffsets):
    #: Its state: the splits it holds and their offsets (``SplitOffsets``'). A split's rows are
    #: a function of its id, so a finished split costs an offset, no more (its splits are as
    #: many as ``split.num``).
    STATE_VERSION = 1

    def __init__(self, source: FakeSource, mode: str = JobMode.BATCH, clock=time.monotonic) -> None:
        super().__init__()
        self.source, self.mode, self.clock = source, mode, clock
        schema, sizes = source.output_schema(), source.sizes()
        self.build = row_builder(schema, sizes)  # the general path's rows
        #: A block of a split's rows as one record batch: Lane B's columns (the builder
        #: ``FakeSource.read`` uses), or, for kinds it does not build, the rows as one batch.
        arrow = arrow_schema(schema)
        columns = column_builder(schema, sizes)
        self.build_block = columns or (lambda ids: from_rows(self.build(ids), schema, arrow))
        #: Rows of a split built at once and handed out over the next poll turns (a block): as
        #: many as a Lane B batch holds (``engine.dataplane.batch-rows``), so a turn's records
        #: cost nothing to build and a step's turns (256 of 64) hand the block over whole.
        self.read_ahead = batch_limits()[0]
        self.listed = source.listed_rows()
        self.rate = source.config.get("rows.per-second") or 0.0
        self.interval = (source.config.get("split.read-interval") or 0) / 1000
        #: Pacing, per split in this attempt: (started, offset then), and the next read's time.
        self._paced: dict[str, tuple[float, int]] = {}
        self._next_read: dict[str, float] = {}
        self.retry_at: float | None = None
        self.paced = bool(self.rate or self.interval)
        #: The availability future last handed out, the ``retry_at`` it is for, and its timer.
        self._available: tuple[Future, float | None, Timer | None] | None = None
        #: The rows each split holds (None: an ``endless`` split never ends), by split id. A
        #: STREAMING reader whose splits have ended says NOTHING_AVAILABLE and idles.
        self.limits: dict[str, int | None] = {}
        self._order: list[str] | None = None  # the splits in id order, kept between turns
        #: The block built ahead (split id, first offset, batch, end offset), one at a time;
        #: derived, never checkpointed. Its split is the current one until the block is out.
        self._block: tuple[str, int, pa.RecordBatch, int] | None = None
        #: What a block's row costs in a turn's byte budget: its Arrow buffers' bytes shared
        #: out evenly, measured on the first block.
        self.row_bytes: int | None = None

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

    def is_available(self) -> Future:
        """Done once rows come due (``retry_at``, by a timer on the worker's shared timers,
        not a thread of its own): asked again for the same ``retry_at``, the same future. With
        nothing paced to wait for (every split ended) it stays pending: new splits and the end
        of the input reach the loop as commands of their own. Cancelled (the loop ended), its
        timer is cancelled with it."""
        at, held = self.retry_at, self._available
        if held is not None and held[1] == at and not held[0].done():
            return held[0]
        if held is not None and held[2] is not None:
            held[2].cancel()  # for an older retry time
        future, timer = Future(), None
        if at is not None:
            timer = timers().call_in(at - self.clock(), lambda: _complete(future))
            future.add_done_callback(lambda done: done.cancelled() and timer.cancel())
        self._available = (future, at, timer)
        return future

    def poll(self, context: PollContext) -> PollStatus:
        """Rows from the splits in turn, each split's offset advanced with them.

        In the steady state (no pacing, a turn's records within its byte budget) the splits
        take turns a block at a time: the current split's next ``read_ahead`` rows are built
        at once as Arrow columns, as Lane B reads a batch, go out as a run of whole turns cut
        from it (zero-copy slices), and end the step when they are all out, so a step hands
        over one whole block, that batch itself; then the next split. Otherwise (``_poll``)
        each turn starts with the split after the one the last turn ended in, its rows built
        as they come due."""
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
            split_id, first, batch, end = block  # the current split's, until it is out
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
            end = offset + self.read_ahead
            end = end if limit is None else min(end, limit)
            ids = self.source.row_ids(self.splits[split_id], self.mode, offset, end)
            first, batch = offset, self.build_block(ids)
            if self.row_bytes is None:  # measured once: a row's width barely varies
                self.row_bytes = max(-(-batch.get_total_buffer_size() // (end - offset)), 1)
            self._block = (split_id, first, batch, end)  # one at a time, as a Lane B batch
        offset += context.emit_turns(batch, offset - first, end - first, self.row_bytes)
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


def _complete(future: Future) -> None:
    try:
        future.set_result(None)
    except InvalidStateError:
        pass  # done already
