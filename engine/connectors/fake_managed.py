"""FakeSource's managed reader: the same deterministic rows, read as Lane A reads (bounded,
non-blocking poll turns that emit rows and advance their split's offset together).

Not yet declared as FakeSource's ``managed_capability``: that happens when a reader task group
runs Lane A, so that the allow-list can never put FakeSource in a lane nothing runs.
"""

from __future__ import annotations

from engine.connectors.fake import FakeSource, row_builder
from engine.sourceruntime.capability import ManagedSourceCapability
from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.reader import PollContext, SplitOffsets
from engine.states import JobMode

CAPABILITY = ManagedSourceCapability()
#: What one row of FakeSource costs in a poll turn's byte budget (an estimate: rows are tuples).
ROW_BYTES = 64


class ManagedFakeReader(SplitOffsets):
    def __init__(self, source: FakeSource, mode: str = JobMode.BATCH) -> None:
        super().__init__()
        self.source, self.mode = source, mode
        self.build = row_builder(source.output_schema(), source.sizes())

    def poll(self, context: PollContext) -> PollStatus:
        """Rows from the splits in turn (each turn starts with the split after the one the
        last turn ended in, so no split starves), each split's offset advanced with them."""
        limit = None if self.mode == JobMode.STREAMING else self.source.config["row.num"]
        order = sorted(self.offsets)
        for turn in range(len(order)):
            split_id = order[(self.cursor + turn) % len(order)]
            offset = self.offsets[split_id]
            while limit is None or offset < limit:
                room = (context.limits.max_bytes - context.bytes) // ROW_BYTES
                room = min(context.remaining_records, room if context.records else max(room, 1))
                if room <= 0:  # the byte budget is spent (a turn always makes progress)
                    self.cursor = (self.cursor + turn) % len(order)
                    return PollStatus.MORE_AVAILABLE
                stop = offset + room if limit is None else min(offset + room, limit)
                ids = self.source.row_ids(self.splits[split_id], self.mode, offset, stop)
                context.emit_many(self.build(ids), ROW_BYTES)
                offset = stop
                self.offsets[split_id] = offset  # advanced with the rows, in the same turn
                if context.should_yield():
                    self.cursor = (self.cursor + turn + 1) % len(order)
                    return PollStatus.MORE_AVAILABLE
        if self.no_more_splits and self.mode == JobMode.BATCH:
            return PollStatus.END_OF_INPUT
        return PollStatus.NOTHING_AVAILABLE
