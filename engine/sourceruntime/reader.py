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
from dataclasses import dataclass
from typing import Any, Protocol

from engine.sourceruntime.capability import (
    MANAGED_LANE_VERSION,
    RUNTIME_METADATA_VERSION,
    check_snapshot_versions,
)
from engine.sourceruntime.choices import CommandKind, PollStatus
from engine.sourceruntime.envelope import PROTOCOL_VERSION
from engine.sourceruntime.lifecycle import Life, Lifecycle, SchemaChange
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.mailbox import Queued, ReaderMailbox

#: Poll turns one step may run back to back while nothing else is queued.
TURNS_PER_STEP = 64


class PollContext:
    """What one poll turn may still do; ``emit`` hands a record over with its size.

    The turns of one step share their output (``out``, complete after ``settle()``): a turn's
    budget counts from where it began, so handing a turn's records over costs nothing, and
    slices of one list emitted end to end (``emit_slice``) are copied once, when settled; a
    whole list so emitted is handed over as it is (``out`` is then the reader's list, copied
    before anything is added to it: the context never changes a list the reader lent it).
    """

    __slots__ = (
        "_box",
        "_lent",
        "_run",
        "_run_start",
        "_run_stop",
        "bytes",
        "clock",
        "deadline",
        "ended",
        "first",
        "length",
        "limits",
        "out",
        "started",
        "step_ended",
        "turns_left",
    )

    def __init__(
        self,
        limits: PollLimits,
        clock: Callable[[], float],
        started: float,
        box: ReaderMailbox | None = None,
    ) -> None:
        self.limits, self.clock = limits, clock
        self.out: list = []
        #: Further turns this poll call may start (``next_turn``), and how many it ended so.
        self.turns_left, self.ended = 0, 0
        #: The mailbox the event loop checks between turns (None: one turn per call).
        self._box = box
        self.length = 0  # records emitted this step, the pending slice included
        self._run: list | None = None  # a slice emitted but not copied yet: _run[start:stop]
        self._run_start = self._run_stop = 0
        self._lent = False  # whether out is a list the reader emitted whole (never changed)
        self.step_ended = False  # the reader reached a natural end of a batch (end_step)
        self.begin(started)

    def begin(self, started: float) -> None:
        """A new turn starts now, its records after those already emitted."""
        self.started, self.deadline = started, started + self.limits.soft
        self.first, self.bytes = self.length, 0

    def settle(self) -> list:
        """Every record emitted so far, in order, in ``out``."""
        run = self._run
        if run is not None:
            self._run = None
            if not self.out and self._run_start == 0 and self._run_stop == len(run):
                self.out, self._lent = run, True  # the whole list, slice by slice: no copy
            else:
                self._own().extend(run[self._run_start : self._run_stop])
        return self.out

    def _own(self) -> list:
        """``out``, to add to: a list the reader lent is copied first."""
        if self._lent:
            self.out, self._lent = list(self.out), False
        return self.out

    @property
    def records(self) -> list:
        """This turn's records so far."""
        return self.settle()[self.first :]

    @property
    def count(self) -> int:
        return self.length - self.first

    def emit(self, record: tuple, size: int = 0) -> None:
        if self._run is not None:
            self.settle()
        self._own().append(record)
        self.length += 1
        self.bytes += size

    def emit_many(self, records: list[tuple], size_each: int = 0) -> None:
        """A block of records at once (what a batch-minded reader produces)."""
        if self._run is not None:
            self.settle()
        self._own().extend(records)
        self.length += len(records)
        self.bytes += size_each * len(records)

    def emit_slice(self, rows: list, start: int, stop: int, size_each: int = 0) -> None:
        """``rows[start:stop]``, of a list the reader no longer changes: a slice that goes on
        where the last one ended, in the same list, extends it instead of being copied."""
        if self._run is not rows or self._run_stop != start:
            if self._run is not None:
                self.settle()
            self._run, self._run_start = rows, start
        self._run_stop = stop
        self.length += stop - start
        self.bytes += size_each * (stop - start)

    def emit_turns(self, rows: list, start: int, stop: int, size_each: int = 0) -> int:
        """``rows[start:stop]`` (a list the reader no longer changes) as back-to-back turns: the
        first fills what this turn's budgets still allow, each further one begins only where
        ``next_turn`` would begin one. Returns how many records were emitted, for the reader
        to advance its state by as many before it returns (nothing runs between these turns but
        the loop's checks). The last turn stays open when the rows end inside it."""
        limits = self.limits
        per_turn = limits.max_records
        if size_each:
            per_turn = min(per_turn, limits.max_bytes // size_each)
            room = min(per_turn - self.count, (limits.max_bytes - self.bytes) // size_each)
        else:
            room = per_turn - self.count
        per_turn = max(per_turn, 1)  # a turn always makes progress
        if room <= 0:
            if self.count:
                return 0  # this turn's budget is spent
            room = 1  # a record larger than the byte budget still goes, alone
        taken = min(start + room, stop)
        self.emit_slice(rows, start, taken, size_each)
        if taken == stop or not self.next_turn():
            return taken - start
        # Further turns, each filled at once (turns are cut from one slice). Between two of
        # them only the mailbox is checked, inline (this is the hot path): no reader code runs
        # between them, so none can overrun its soft duration (next_turn has just read the
        # clock for the turn that did run reader code); the last one's start is read once.
        box = self._box
        terminal = box.terminal
        turns = min(-(-(stop - taken) // per_turn), self.turns_left + 1)
        k = 1  # turn k gets its records: a whole turn's, or the rest of the rows
        while k < turns and not box.commands and terminal.kind is None:
            k += 1
        last = min(per_turn, stop - taken - (k - 1) * per_turn)
        filled = (k - 1) * per_turn + last
        self.emit_slice(rows, taken, taken + filled)
        self.first, self.bytes = self.length - last, last * size_each
        if k > 1:
            self.started = self.clock()
            self.deadline = self.started + limits.soft
        self.turns_left -= k - 1
        self.ended += k - 1
        return taken + filled - start

    @property
    def remaining_records(self) -> int:
        return max(self.limits.max_records - self.length + self.first, 0)

    def next_turn(self) -> bool:
        """The turn so far is complete (its records emitted, their state advanced): True if
        another turn has begun, in this same call, because the event loop would have started
        one now: turns are left in this step, the turn kept within its soft duration, and
        nothing else (terminal signal, ordered control, completion) is queued. This is the
        check the loop makes between turns, made here, so a reader with cheap turns saves a
        call per turn; False: return from ``poll`` (with MORE_AVAILABLE) without emitting."""
        if self.turns_left <= 0 or self._box is None or self._box.has_work():
            return False
        now = self.clock()
        if now - self.started > self.limits.soft:
            return False  # the loop accounts for the overrun once poll returns
        self.turns_left -= 1
        self.ended += 1
        self.begin(now)
        return True

    def end_step(self) -> None:
        """The records so far end a batch of the reader's (a block it built is all out): the
        loop hands them over now rather than going on into another turn in this step, so a
        step's records are that batch, handed over uncopied, rather than parts of two. The
        reader returns from ``poll`` right after (MORE_AVAILABLE if it has more)."""
        self.step_ended, self.turns_left = True, 0

    def should_yield(self) -> bool:
        return (
            self.length - self.first >= self.limits.max_records
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
            check_snapshot_versions(restored.metadata, PROTOCOL_VERSION)  # before anything runs
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
            self._poll_turns()
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

    def _poll_turns(self) -> None:
        """Poll turns back to back while the reader has more and nothing else is queued: a
        control (or the terminal signal) still waits for one turn at most, as it is checked
        between turns. Their records are handed over together, once the last turn ends."""
        clock, poll, limits, has_work = (
            self.clock,
            self.reader.poll,
            self.limits,
            self.mailbox.has_work,
        )
        soft, hard = limits.soft, limits.hard
        context = PollContext(limits, clock, clock(), self.mailbox)
        turns = 0
        while True:
            context.turns_left = TURNS_PER_STEP - turns - 1
            status = poll(context)
            now = clock()
            turns += 1 + context.ended  # the turns it went on with, and the one it ended in
            context.ended = 0
            if now - context.started > soft:
                self.metrics.soft_overruns += 1
                if now - context.started > hard:
                    self.metrics.hard_wakeups += 1
                    self.reader.wakeup()
            if (
                status is not PollStatus.MORE_AVAILABLE
                or turns >= TURNS_PER_STEP
                or context.step_ended
                or has_work()
            ):
                break
            context.begin(now)  # the next turn
        self.metrics.poll_turns += turns
        if context.length:
            self.metrics.records += context.length
            self.emit(context.settle())
        if status == PollStatus.NOTHING_AVAILABLE:
            self.available = False  # until AVAILABLE, an assignment or its retry time
            self.retry_at = getattr(self.reader, "retry_at", None)
        elif status == PollStatus.END_OF_INPUT:
            self.available = False
            self.close_latched = True
