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

from engine.sourceruntime.availability import Availability
from engine.sourceruntime.capability import (
    MANAGED_LANE_VERSION,
    RUNTIME_METADATA_VERSION,
    check_snapshot_versions,
)
from engine.sourceruntime.choices import CommandKind, PollStatus
from engine.sourceruntime.envelope import PROTOCOL_VERSION
from engine.sourceruntime.latency import LatencyHistogram
from engine.sourceruntime.lifecycle import Life, Lifecycle, SchemaChange
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.mailbox import Queued, ReaderMailbox
from engine.sourceruntime.ownership import RecentAssignments, lineage_of
from engine.sourceruntime.poll_context import TURNS_PER_STEP as TURNS_PER_STEP
from engine.sourceruntime.poll_context import PollContext as PollContext
from engine.sourceruntime.poll_context import rows_of as rows_of
from engine.sourceruntime.schema_change import SchemaDriver
from engine.sourceruntime.split_offsets import SplitOffsets as SplitOffsets  # its home before
from engine.sourceruntime.watchdog import PollWatch, wake_of


class ManagedReader(Protocol):
    """What a connector implements to run in Lane A. ``wakeup()`` may be called from any
    thread, any number of times, and must not block: it ends the poll call in progress soon (a
    reader that waits for something makes the wait end; one that keeps ``wake``, a ``Wakeup``,
    has its poll context end the call at its next turn or record boundary). ``STATE_VERSION``
    is the version of what ``snapshot()`` returns: recorded with each snapshot, and a restore of
    a newer one (or of none) is refused before anything runs. Optional: ``is_available()``, a
    future done once a poll is worth making again (engine.sourceruntime.availability)."""

    STATE_VERSION: int

    def add_splits(self, splits: list[dict]) -> None: ...
    def notify_no_more_splits(self) -> None: ...
    def poll(self, context: PollContext) -> PollStatus: ...
    def snapshot(self) -> Any: ...
    def wakeup(self) -> None: ...


@dataclass
class Snapshot:
    checkpoint: int
    state: Any
    metadata: dict
    #: The schema its rows after it are of, when a schema change made it other than the plan's.
    schema: list | None = None


@dataclass
class Metrics:
    poll_turns: int = 0
    records: int = 0
    soft_overruns: int = 0
    hard_wakeups: int = 0
    applied: int = 0
    stale_callbacks: int = 0
    #: Checkpoint barriers' waits: admitted into the mailbox until the loop applies them.
    control_latency: LatencyHistogram = field(default_factory=LatencyHistogram)


class ReaderEventLoop:
    def __init__(
        self,
        mailbox: ReaderMailbox,
        reader: ManagedReader,
        limits: PollLimits,
        emit: Callable[[Any], None],
        on_snapshot: Callable[[Snapshot], None],
        capability_digest: str,
        lineage: list[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        may_close: Callable[[], bool] = lambda: True,
        on_callback: Callable[[CommandKind, int], None] = lambda kind, checkpoint: None,
        on_applied: Callable[[CommandKind, dict], None] = lambda kind, payload: None,
        checkpointing: bool = True,
        request_checkpoint: Callable[[], None] = lambda: None,
        apply_schema: Callable[[list], None] = lambda schema: None,
    ) -> None:
        self.mailbox, self.reader, self.limits, self.clock = mailbox, reader, limits, clock
        self.emit, self.on_snapshot = emit, on_snapshot
        #: Whether a draining reader may close (a checkpointed one: once its final checkpoint
        #: is committed); until then it keeps applying controls.
        self.may_close = may_close
        #: Told of a checkpoint callback (complete or abort) for a snapshot this attempt took,
        #: after it is applied (the sinks' commit follows a completion).
        self.on_callback = on_callback
        #: Told of an assignment or a registration once applied (the task group acknowledges
        #: an assignment to its enumerator: flow control, never waited for).
        self.on_applied = on_applied
        self.capability_digest = capability_digest
        self.lineage = lineage_of(lineage, mailbox.attempt)
        #: The connector state's version, recorded with every snapshot (``STATE_VERSION``).
        self.state_version: int = getattr(reader, "STATE_VERSION", 1)
        #: Assignments the enumerator's cut may not know yet (none without checkpoints).
        self.recent = RecentAssignments()
        self.checkpointing = checkpointing
        #: The enumerator's confirmation of this attempt's registration (its REGISTER command).
        self.registration: dict | None = None
        self.life = Lifecycle()
        #: A schema change's driver (engine.sourceruntime.schema_change): the task group asks
        #: for the schema checkpoint (``request_checkpoint``) and makes its sinks follow
        #: (``apply_schema``).
        self.schema_driver = SchemaDriver(
            reader,
            clock,
            limits.schema_change_timeout,
            checkpointing,
            request_checkpoint,
            apply_schema,
        )
        self.schema: SchemaChange = self.schema_driver.machine
        self.metrics = Metrics()
        #: The reader's wakeup flag, and the watch the process's poll watchdog reads once the
        #: task group registers it: a call past its hard budget, or in progress when the
        #: terminal signal is raised, is woken (engine.sourceruntime.watchdog).
        self.wake = wake_of(reader)
        self.watch = PollWatch(reader.wakeup, self.wake, limits, clock, self.metrics)
        mailbox.on_terminal = self.watch.terminal
        self.no_more_splits_generation = 0
        self.available = True  # a poll turn is wanted (set by AVAILABLE, MORE_AVAILABLE)
        #: When a reader that had nothing said it will have more (a paced source): the loop's
        #: own timer for availability, so a poll turn is never lost waiting for a command.
        #: Only for a reader without ``is_available()``, whose future's completion is an
        #: AVAILABLE command instead (engine.sourceruntime.availability).
        self.retry_at: float | None = None
        self.availability = Availability(mailbox)
        self.close_latched = False
        #: Its poll said END_OF_INPUT: its close is the end of its input, not a graceful one.
        self.input_ended = False
        self.snapshots: list[int] = []  # checkpoints snapshotted, in order

    def start(self, restored: Snapshot | None = None) -> None:
        if restored is not None:
            # Before anything runs: every version the snapshot records, its state's included.
            check_snapshot_versions(restored.metadata, PROTOCOL_VERSION, self.state_version)
            self.life.move(Life.RESTORING)
            self.mailbox.restore_watermarks(restored.metadata["appliedSenderWatermarks"])
            self.recent.restore(restored.metadata.get("recentAssignments"))
            self.no_more_splits_generation = restored.metadata["noMoreSplitsGeneration"]
            self.schema_driver.current = restored.schema
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
        if self.schema_driver.step():
            return True
        if self.close_latched and not self.schema.blocks_polling:
            # Graceful close or end of input, acted on once no schema change is under way.
            if self.life.state == Life.RUNNING:
                self.life.move(Life.DRAINING)
                return True
            if self.may_close():
                self.life.move(Life.CLOSED)
                self.availability.close()  # no availability timer outlives the attempt
                return True
            return False
        if not self.available and (
            (self.retry_at is not None and self.clock() >= self.retry_at)
            or self.availability.take_missed()
        ):
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
        self.schema_driver.fence()
        kind = self.mailbox.terminal.kind
        self.life.move(Life.CANCELLING if kind == CommandKind.CANCEL else Life.FAILED)
        self.reader.wakeup()
        self.life.move(Life.CLOSED)
        self.availability.close()

    def _apply(self, queued: Queued) -> None:
        env = queued.envelope
        kind = env.kind
        payload = json.loads(env.payload) if env.payload else {}
        if kind == CommandKind.ASSIGN_SPLITS:
            self.reader.add_splits(payload["splits"])
            self.available = True
            if self.checkpointing:
                ids = [s["splitId"] if isinstance(s, dict) else s for s in payload["splits"]]
                self.recent.applied(env.senderAttemptId, env.senderSequence, ids)
        elif kind == CommandKind.NO_MORE_SPLITS:
            self.reader.notify_no_more_splits()
            self.no_more_splits_generation += 1
            self.available = True  # a reader that had nothing may now be at its end
        elif kind == CommandKind.CHECKPOINT:
            self.metrics.control_latency.record(self.mailbox.clock() - queued.admitted_at)
            self._snapshot(payload["checkpoint"])
        elif kind in (CommandKind.CHECKPOINT_COMPLETE, CommandKind.CHECKPOINT_ABORT):
            checkpoint = payload["checkpoint"]
            if checkpoint not in self.snapshots:
                self.metrics.stale_callbacks += 1  # a callback for a snapshot never taken
            else:
                self.on_callback(kind, checkpoint)
            if kind == CommandKind.CHECKPOINT_ABORT:
                self.schema_driver.aborted(checkpoint)  # the schema checkpoint's: it fails
            if kind == CommandKind.CHECKPOINT_COMPLETE:
                self.checkpoint_completed(checkpoint)
            elif checkpoint in self.snapshots:
                self.snapshots.remove(checkpoint)  # no other callback comes for it
        elif kind == CommandKind.REGISTER:
            self.registration = payload  # the mailbox settles the sender's sequences below
        elif kind == CommandKind.GRACEFUL_CLOSE:
            self.close_latched = True
            if self.checkpointing:  # its final snapshot: at the next checkpoint, asked for now
                self.schema_driver.request_checkpoint()
        elif kind == CommandKind.AVAILABLE:
            self.available = True
            self.availability.wakeups += 1
        self.mailbox.applied(env)
        self.metrics.applied += 1
        if kind in (CommandKind.ASSIGN_SPLITS, CommandKind.REGISTER):
            self.on_applied(kind, payload)

    def checkpoint_completed(self, checkpoint: int) -> None:
        """Checkpoint ``checkpoint`` completed (its callback, or the task group's commits saw
        it): callbacks for it and earlier snapshots will not come (committing it committed
        them), and the assignments it held are released from the metadata."""
        self.snapshots = [c for c in self.snapshots if c > checkpoint]
        self.recent.completed(checkpoint)
        self.schema_driver.completed(checkpoint)

    def _snapshot(self, checkpoint: int) -> None:
        """Every ordered command before the barrier has been applied (FIFO); the snapshot
        holds the reader's state and the runtime metadata, never the mailbox."""
        if self.mailbox.terminal:
            return  # a terminal preemption: this checkpoint does not succeed
        self.schema_driver.on_barrier(checkpoint)  # a schema change's checkpoint, if it waits
        snapshot = Snapshot(
            checkpoint, self.reader.snapshot(), self.metadata(), self.schema_driver.schema_now()
        )
        self.snapshots.append(checkpoint)  # until its callback, or a later completion
        self.recent.snapshotted(checkpoint)
        self.on_snapshot(snapshot)

    def metadata(self) -> dict:
        return {
            "metadataVersion": RUNTIME_METADATA_VERSION,
            "commandProtocolVersion": PROTOCOL_VERSION,
            "managedLaneVersion": MANAGED_LANE_VERSION,
            "connectorStateVersion": self.state_version,
            "readerAttemptLineage": list(self.lineage),
            "appliedSenderWatermarks": self.mailbox.watermarks(),
            "recentAssignments": self.recent.to_json(),
            "noMoreSplitsGeneration": self.no_more_splits_generation,
            "capabilityDigest": self.capability_digest,
        }

    def _poll_turns(self) -> None:
        """Poll turns back to back while the reader has more and nothing else is queued: a
        control (or the terminal signal) still waits for one turn at most, as it is checked
        between turns. Their records are handed over together, once the last turn ends, part by
        part (``PollContext.settle``: each a record batch or a list of rows). Each
        poll turn's start is marked on the watch (as a call starts, and by the context as a
        turn begins within it; None after the call): the watchdog wakes a turn past the hard
        budget, never a call of many turns for their sum."""
        clock, poll, limits, has_work, wake, watch = (
            self.clock,
            self.reader.poll,
            self.limits,
            self.mailbox.has_work,
            self.wake,
            self.watch,
        )
        soft = limits.soft
        context = PollContext(limits, clock, clock(), self.mailbox, wake, watch)
        turns = 0
        while True:
            context.turns_left = TURNS_PER_STEP - turns - 1
            wake.woken = False  # a wakeup ends the call in progress, not this one
            watch.started = context.started
            try:
                status = poll(context)
            finally:
                watch.started = None
            now = clock()
            turns += 1 + context.ended  # the turns it went on with, and the one it ended in
            context.ended = 0
            if now - context.started > soft:
                self.metrics.soft_overruns += 1
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
            for part in context.settle():  # a record batch, or a list of rows (poll_context)
                self.emit(part)
        self.schema_driver.after_poll()  # a schema change it asked for starts here
        if status == PollStatus.NOTHING_AVAILABLE:
            self.available = False  # until AVAILABLE, an assignment or its retry time
            self.retry_at = self.availability.await_reader(self.reader)
        elif status == PollStatus.END_OF_INPUT:
            self.available = False
            self.close_latched = self.input_ended = True
