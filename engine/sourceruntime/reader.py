"""The reader event loop: the one owner of a managed reader's checkpoint-visible state.

It runs on the reader task group's own thread (no thread per task) as a loop of steps, each
returning whether it did work: the terminal signal first, then one ordered control (split
assignments, no-more-splits, checkpoint barriers, checkpoint callbacks, graceful close) in
mailbox sequence order, then async completions, then at most one poll turn, bounded by records,
bytes and time. Because a poll turn only starts when no ordered control is queued, every command
admitted before a barrier is applied before its snapshot, and a turn's records and the split
state they advance are complete before the next snapshot can run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.sourceruntime.capability import MANAGED_LANE_VERSION, RUNTIME_METADATA_VERSION
from engine.sourceruntime.choices import CommandKind, PollStatus
from engine.sourceruntime.envelope import PROTOCOL_VERSION
from engine.sourceruntime.lifecycle import Life, Lifecycle, SchemaChange
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.mailbox import Queued, ReaderMailbox

#: Poll turns one step may run back to back while nothing else is queued.
TURNS_PER_STEP = 64


@dataclass
class PollContext:
    """What one poll turn may still do; ``emit`` hands a record over with its size."""

    limits: PollLimits
    clock: Callable[[], float]
    started: float
    records: list = field(default_factory=list)
    bytes: int = 0

    def emit(self, record: tuple, size: int = 0) -> None:
        self.records.append(record)
        self.bytes += size

    def emit_many(self, records: list[tuple], size_each: int = 0) -> None:
        """A block of records at once (what a batch-minded reader produces)."""
        self.records.extend(records)
        self.bytes += size_each * len(records)

    @property
    def remaining_records(self) -> int:
        return max(self.limits.max_records - len(self.records), 0)

    @property
    def deadline(self) -> float:
        return self.started + self.limits.soft

    def should_yield(self) -> bool:
        return (
            len(self.records) >= self.limits.max_records
            or self.bytes >= self.limits.max_bytes
            or self.clock() >= self.deadline
        )


class ManagedReader(Protocol):
    """What a connector implements to run in Lane A."""

    def add_splits(self, splits: list[dict]) -> None: ...
    def notify_no_more_splits(self) -> None: ...
    def poll(self, context: PollContext) -> PollStatus: ...
    def snapshot(self) -> Any: ...
    def wakeup(self) -> None: ...


class SplitOffsets:
    """The checkpoint-visible state most managed readers keep: their splits by id and how far
    each was read. Assignments are idempotent (a split assigned twice is read once); a poll
    never blocks, so ``wakeup()`` has nothing to interrupt."""

    def __init__(self) -> None:
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
        return None


@dataclass
class Snapshot:
    checkpoint: int
    state: Any
    metadata: dict


@dataclass
class Metrics:
    poll_turns: int = 0
    records: int = 0
    soft_overruns: int = 0
    hard_wakeups: int = 0
    applied: int = 0
    stale_callbacks: int = 0


class ReaderEventLoop:
    def __init__(
        self,
        mailbox: ReaderMailbox,
        reader: ManagedReader,
        limits: PollLimits,
        emit: Callable[[list], None],
        on_snapshot: Callable[[Snapshot], None],
        capability_digest: str,
        lineage: list[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        may_close: Callable[[], bool] = lambda: True,
        on_callback: Callable[[CommandKind, int], None] = lambda kind, checkpoint: None,
    ) -> None:
        self.mailbox, self.reader, self.limits, self.clock = mailbox, reader, limits, clock
        self.emit, self.on_snapshot = emit, on_snapshot
        #: Whether a draining reader may close (a checkpointed one: once its final checkpoint
        #: is committed); until then it keeps applying controls.
        self.may_close = may_close
        #: Told of a checkpoint callback (complete or abort) for a snapshot this attempt took,
        #: after it is applied (the sinks' commit follows a completion).
        self.on_callback = on_callback
        self.capability_digest = capability_digest
        self.lineage = [*(lineage or []), mailbox.attempt]
        self.life = Lifecycle()
        self.schema = SchemaChange()
        self.metrics = Metrics()
        self.no_more_splits_generation = 0
        self.available = True  # a poll turn is wanted (set by AVAILABLE, MORE_AVAILABLE)
        #: When a reader that had nothing said it will have more (a paced source): the loop's
        #: own timer for availability, so a poll turn is never lost waiting for a command.
        self.retry_at: float | None = None
        self.close_latched = False
        self.snapshots: list[int] = []  # checkpoints snapshotted, in order

    def start(self, restored: Snapshot | None = None) -> None:
        if restored is not None:
            self.life.move(Life.RESTORING)
            self.mailbox.restore_watermarks(restored.metadata["appliedSenderWatermarks"])
            self.no_more_splits_generation = restored.metadata["noMoreSplitsGeneration"]
        self.life.move(Life.RUNNING)

    # -- one step ---------------------------------------------------------------------------

    def step(self) -> bool:
        """One unit of work; False when there was nothing to do (the caller waits for a
        wakeup or its next tick)."""
        if self.mailbox.terminal and self.life.live:
            self._terminate()
            return True
        if not self.life.live:
            return False
        queued = self.mailbox.take()
        if queued is not None:
            self._apply(queued)
            return True
        if self.close_latched and not self.schema.blocks_polling:
            # Graceful close or end of input, acted on once no schema change is under way.
            if self.life.state == Life.RUNNING:
                self.life.move(Life.DRAINING)
                return True
            if self.may_close():
                self.life.move(Life.CLOSED)
                return True
            return False
        if not self.available and self.retry_at is not None and self.clock() >= self.retry_at:
            self.available, self.retry_at = True, None
        if self.life.state == Life.RUNNING and self.available and not self.schema.blocks_polling:
            # Turns back to back while nothing else is queued: a control (or the terminal
            # signal) still waits for one turn at most, as it is checked between turns.
            for _ in range(TURNS_PER_STEP):
                if not self._poll_turn() or self.mailbox.has_work():
                    break
            return True
        return False

    def idle_for(self, longest: float) -> float:
        """How long the caller may wait for a wakeup before the next step is due anyway."""
        if self.available or self.retry_at is None:
            return longest
        return min(max(self.retry_at - self.clock(), 0.0), longest)

    def _terminate(self) -> None:
        self.schema.fence()
        kind = self.mailbox.terminal.kind
        self.life.move(Life.CANCELLING if kind == CommandKind.CANCEL else Life.FAILED)
        self.reader.wakeup()
        self.life.move(Life.CLOSED)

    def _apply(self, queued: Queued) -> None:
        env = queued.envelope
        kind = env.kind
        payload = json.loads(env.payload) if env.payload else {}
        if kind == CommandKind.ASSIGN_SPLITS:
            self.reader.add_splits(payload["splits"])
            self.available = True
        elif kind == CommandKind.NO_MORE_SPLITS:
            self.reader.notify_no_more_splits()
            self.no_more_splits_generation += 1
            self.available = True  # a reader that had nothing may now be at its end
        elif kind == CommandKind.CHECKPOINT:
            self._snapshot(payload["checkpoint"])
        elif kind in (CommandKind.CHECKPOINT_COMPLETE, CommandKind.CHECKPOINT_ABORT):
            if payload["checkpoint"] not in self.snapshots:
                self.metrics.stale_callbacks += 1  # a callback for a snapshot never taken
            else:
                self.on_callback(kind, payload["checkpoint"])
        elif kind == CommandKind.GRACEFUL_CLOSE:
            self.close_latched = True
        elif kind == CommandKind.AVAILABLE:
            self.available = True
        self.mailbox.applied(env)
        self.metrics.applied += 1

    def _snapshot(self, checkpoint: int) -> None:
        """Every ordered command before the barrier has been applied (FIFO); the snapshot
        holds the reader's state and the runtime metadata, never the mailbox."""
        if self.mailbox.terminal:
            return  # a terminal preemption: this checkpoint does not succeed
        snapshot = Snapshot(checkpoint, self.reader.snapshot(), self.metadata())
        self.snapshots.append(checkpoint)
        self.on_snapshot(snapshot)

    def metadata(self) -> dict:
        return {
            "metadataVersion": RUNTIME_METADATA_VERSION,
            "commandProtocolVersion": PROTOCOL_VERSION,
            "managedLaneVersion": MANAGED_LANE_VERSION,
            "readerAttemptLineage": list(self.lineage),
            "appliedSenderWatermarks": self.mailbox.watermarks(),
            "noMoreSplitsGeneration": self.no_more_splits_generation,
            "capabilityDigest": self.capability_digest,
        }

    def _poll_turn(self) -> bool:
        """One poll turn; True if the reader has more right away."""
        started = self.clock()
        context = PollContext(self.limits, self.clock, started)
        status = self.reader.poll(context)
        elapsed = self.clock() - started
        self.metrics.poll_turns += 1
        self.metrics.records += len(context.records)
        if elapsed > self.limits.soft:
            self.metrics.soft_overruns += 1
        if elapsed > self.limits.hard:
            self.metrics.hard_wakeups += 1
            self.reader.wakeup()
        if context.records:
            self.emit(context.records)
        if status == PollStatus.NOTHING_AVAILABLE:
            self.available = False  # until AVAILABLE, an assignment or its retry time
            self.retry_at = getattr(self.reader, "retry_at", None)
        elif status == PollStatus.END_OF_INPUT:
            self.available = False
            self.close_latched = True
        return status == PollStatus.MORE_AVAILABLE
