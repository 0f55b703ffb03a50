"""The reader event loop, deterministically: every adjacent command/barrier order, poll turns
that yield at their budgets, availability wakeups, terminal preemption, duplicates and stale
attempts, checkpoint callback order, and each lifecycle and schema-change transition."""

from __future__ import annotations

import pytest

from engine.sourceruntime import CommandKind, MailboxLimits, ReaderMailbox, WorkerBudget
from engine.sourceruntime.choices import AdmissionStatus, PollStatus
from engine.sourceruntime.lifecycle import (
    IllegalTransition,
    Life,
    Lifecycle,
    Schema,
    SchemaChange,
    SchemaChangeFailed,
)
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.reader import TURNS_PER_STEP, ReaderEventLoop
from tests.source_conformance import envelope_for


class CountingReader:
    """A managed reader over in-memory splits of ``size`` records each: a split's state is how
    far it was read, advanced only inside a poll turn together with the records emitted."""

    def __init__(self, size: int = 100, clock=None, slow: float = 0.0) -> None:
        self.size, self.clock, self.slow = size, clock, slow
        self.splits: dict[str, int] = {}
        self.no_more = False
        self.wakeups = 0

    def add_splits(self, splits):
        for split in splits:
            self.splits.setdefault(split, 0)

    def notify_no_more_splits(self):
        self.no_more = True

    def poll(self, context):
        if self.slow:
            self.clock.advance(self.slow)
        for split in sorted(self.splits):
            while self.splits[split] < self.size:
                context.emit((split, self.splits[split]), 8)
                self.splits[split] += 1
                if context.should_yield():
                    return PollStatus.MORE_AVAILABLE
        return PollStatus.END_OF_INPUT if self.no_more else PollStatus.NOTHING_AVAILABLE

    def snapshot(self):
        return dict(self.splits)

    def wakeup(self):
        self.wakeups += 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def send(box, kind, payload=None, attempt=2):
    env = envelope_for(box, kind, payload, attempt)
    return box.admit(env), env


def loop(size=100, slow=0.0, **limits):
    clock = Clock()
    box = ReaderMailbox(1, "1/1", 2, MailboxLimits(), WorkerBudget(10**9), clock=clock)
    reader = CountingReader(size, clock, slow)
    out, snaps, turns = [], [], []
    poll = reader.poll

    def poll_one_turn(context):  # CountingReader's poll is one turn: count its records
        status = poll(context)
        turns.append(context.count)
        return status

    reader.poll = poll_one_turn
    event_loop = ReaderEventLoop(
        box, reader, PollLimits(**limits), out.extend, snaps.append, "digest", clock=clock
    )
    event_loop.start()
    event_loop.turns = turns  # records of each poll turn
    return event_loop, box, reader, out, snaps


def drain(event_loop, limit=10_000):
    for _ in range(limit):
        if not event_loop.step():
            return
    raise AssertionError("the loop never went idle")


CONTROLS = {
    "assign": (CommandKind.ASSIGN_SPLITS, {"splits": ["b"]}),
    "no-more-splits": (CommandKind.NO_MORE_SPLITS, None),
    "close": (CommandKind.GRACEFUL_CLOSE, None),
    "complete-1": (CommandKind.CHECKPOINT_COMPLETE, {"checkpoint": 1}),
}


@pytest.mark.parametrize("control", sorted(CONTROLS))
@pytest.mark.parametrize("before", [True, False], ids=["before-barrier", "after-barrier"])
def test_a_command_admitted_before_a_barrier_is_in_its_snapshot_and_one_after_is_not(
    control, before
):
    event_loop, box, _reader, _, snaps = loop()
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    send(box, CommandKind.CHECKPOINT, {"checkpoint": 1})
    drain(event_loop)
    commands = [CONTROLS[control], (CommandKind.CHECKPOINT, {"checkpoint": 2})]
    for kind, payload in commands if before else commands[::-1]:
        send(box, kind, payload)
    drain(event_loop)
    second = next(s for s in snaps if s.checkpoint == 2)
    if control == "assign":
        assert ("b" in second.state) == before
    if control == "no-more-splits":
        assert second.metadata["noMoreSplitsGeneration"] == (1 if before else 0)
    applied = second.metadata["appliedSenderWatermarks"]["1"]
    assert applied == {"upto": 2 if before else 1, "above": []}  # applied at the cut


def test_no_poll_turn_runs_between_an_admitted_control_and_its_application():
    event_loop, box, _, out, snaps = loop(size=10**6)
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    event_loop.step()  # applies the assignment
    event_loop.step()  # poll turns, back to back while nothing else is queued
    assert len(out) == 64 * TURNS_PER_STEP and set(event_loop.turns) == {64}
    send(box, CommandKind.CHECKPOINT, {"checkpoint": 7})
    event_loop.step()  # the barrier comes before any further turn
    assert snaps[-1].state == {"a": len(out)} and len(out) == 64 * TURNS_PER_STEP


def test_turns_stop_back_to_back_as_soon_as_a_control_is_queued():
    event_loop, box, _, out, snaps = loop(size=10**6)
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    event_loop.step()
    box.wakeup = lambda: None
    original = event_loop.reader.poll

    def poll_then_barrier(context):
        status = original(context)
        if len(event_loop.turns) == 3:  # a barrier arrives during the third turn
            send(box, CommandKind.CHECKPOINT, {"checkpoint": 1})
        return status

    event_loop.reader.poll = poll_then_barrier
    event_loop.step()
    assert len(event_loop.turns) == 3  # the turn in progress ends; no fourth one
    event_loop.step()
    assert snaps[-1].state == {"a": len(out)}


def test_a_poll_turn_yields_at_its_record_byte_and_time_budgets():
    event_loop, box, reader, _, _ = loop(size=10**6, max_records=10)
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    event_loop.step(), event_loop.step()
    assert set(event_loop.turns) == {10}
    event_loop, box, reader, _, _ = loop(size=10**6, max_bytes=40)
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    event_loop.step(), event_loop.step()
    assert set(event_loop.turns) == {5}  # 8 bytes a record
    event_loop, box, reader, _, _ = loop(size=10**6, slow=0.01, soft=0.005, hard=0.008)
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    event_loop.step(), event_loop.step()
    assert set(event_loop.turns) == {1}  # past its soft deadline after the first record
    assert event_loop.metrics.soft_overruns == len(event_loop.turns)
    # A call past its hard budget is woken while it runs, by the watchdog: no watchdog here
    # (tests/test_source_wakeup_watchdog.py), and no wakeup after the call returned.
    assert event_loop.metrics.hard_wakeups == reader.wakeups == 0


def test_nothing_available_waits_for_an_availability_wakeup():
    event_loop, box, reader, out, _ = loop(size=3)
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    drain(event_loop)
    assert len(out) == 3 and not event_loop.step()  # idle: no busy polling
    reader.size = 5
    send(box, CommandKind.AVAILABLE)
    drain(event_loop)
    assert len(out) == 5


def test_terminal_preempts_queued_work_and_fails_the_pending_checkpoint():
    event_loop, box, reader, _out, snaps = loop()
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    send(box, CommandKind.CHECKPOINT, {"checkpoint": 1})
    box.signal_terminal(CommandKind.CANCEL, "user")
    assert event_loop.step()
    assert event_loop.life.state == Life.CLOSED and snaps == [] and reader.splits == {}
    assert reader.wakeups == 1 and not event_loop.step()
    ack, _ = send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["z"]})
    assert ack.status == AdmissionStatus.TERMINAL_REJECTED


def test_duplicates_and_stale_attempts_have_no_second_effect():
    event_loop, box, reader, _, _ = loop()
    _ack, env = send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    assert box.admit(env).status == AdmissionStatus.DUPLICATE
    drain(event_loop)
    assert box.admit(env).status == AdmissionStatus.DUPLICATE
    stale, _ = send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["x"]}, attempt=1)
    assert stale.status == AdmissionStatus.STALE_TARGET
    assert event_loop.metrics.applied == 1 and set(reader.splits) == {"a"}


def test_checkpoint_callbacks_follow_their_snapshot_and_stale_ones_are_counted():
    event_loop, box, _, _, snaps = loop()
    send(box, CommandKind.CHECKPOINT_COMPLETE, {"checkpoint": 3})  # before its snapshot
    send(box, CommandKind.CHECKPOINT, {"checkpoint": 3})
    send(box, CommandKind.CHECKPOINT_COMPLETE, {"checkpoint": 3})
    send(box, CommandKind.CHECKPOINT_ABORT, {"checkpoint": 9})
    drain(event_loop)
    assert [s.checkpoint for s in snaps] == [3]
    assert event_loop.metrics.stale_callbacks == 2


def test_the_snapshot_metadata_is_versioned_and_restores_the_watermarks():
    event_loop, box, _, _, snaps = loop()
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    send(box, CommandKind.CHECKPOINT, {"checkpoint": 1})
    drain(event_loop)
    metadata = snaps[0].metadata
    assert set(metadata) == {
        "metadataVersion",
        "commandProtocolVersion",
        "managedLaneVersion",
        "connectorStateVersion",
        "readerAttemptLineage",
        "appliedSenderWatermarks",
        "recentAssignments",
        "noMoreSplitsGeneration",
        "capabilityDigest",
    }
    assert metadata["readerAttemptLineage"] == [2]
    fresh = ReaderMailbox(1, "1/1", 3, MailboxLimits(), WorkerBudget(10**9))
    again = ReaderEventLoop(
        fresh, CountingReader(), PollLimits(), list.append, list.append, "digest", [2]
    )
    again.start(snaps[0])
    assert again.life.state == Life.RUNNING and again.lineage == [2, 3]
    assert fresh.watermarks() == metadata["appliedSenderWatermarks"]


def test_graceful_close_and_end_of_input_drain_then_close():
    event_loop, box, _, out, _ = loop(size=5)
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    send(box, CommandKind.NO_MORE_SPLITS)
    drain(event_loop)
    assert len(out) == 5 and event_loop.life.state == Life.CLOSED


def test_no_more_splits_after_an_idle_turn_still_ends_the_input():
    event_loop, box, _, out, _ = loop(size=5)
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    drain(event_loop)
    assert len(out) == 5 and event_loop.life.state == Life.RUNNING  # nothing available
    send(box, CommandKind.NO_MORE_SPLITS)
    drain(event_loop)
    assert event_loop.life.state == Life.CLOSED


def test_a_schema_change_stops_polling_and_a_latched_close_waits_for_it():
    event_loop, box, _, out, _ = loop(size=10**6)
    send(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]})
    event_loop.step()
    event_loop.schema.request(epoch=1)
    send(box, CommandKind.GRACEFUL_CLOSE)
    drain(event_loop)
    assert out == [] and event_loop.life.state == Life.RUNNING  # no turn, close latched
    schema = event_loop.schema
    assert schema.quiesced(1) and schema.triggered(1, checkpoint=4) and schema.completed(1, 4)
    drain(event_loop)
    assert event_loop.life.state == Life.CLOSED


def test_every_lifecycle_transition():
    for path in (
        [Life.RUNNING, Life.DRAINING, Life.CLOSED],
        [Life.RESTORING, Life.RUNNING, Life.CANCELLING, Life.CLOSED],
        [Life.RUNNING, Life.FAILED, Life.CLOSED],
        [Life.CANCELLING, Life.CLOSED],
    ):
        life = Lifecycle()
        for state in path:
            life.move(state)
    for source, target in ((Life.CLOSED, Life.RUNNING), (Life.RUNNING, Life.RESTORING)):
        life = Lifecycle()
        life.state = source
        with pytest.raises(IllegalTransition):
            life.move(target)


def test_every_schema_transition_stale_and_duplicate_callbacks_and_failures():
    change = SchemaChange()
    change.request(epoch=5)
    assert change.state == Schema.QUIESCING
    assert not change.triggered(5, 1)  # out of order: ignored
    assert change.quiesced(5) and not change.quiesced(5)  # a duplicate
    assert not change.quiesced(4)  # another epoch
    assert change.triggered(5, checkpoint=8) and change.state == Schema.WAITING_END
    assert not change.completed(5, 7)  # not the bound checkpoint
    assert change.completed(5, 8) and change.state == Schema.IDLE
    assert change.ignored == 4
    change.request(epoch=6)
    with pytest.raises(SchemaChangeFailed, match="already under way"):
        change.request(epoch=7)  # overlapping
    change.failed(5, "timeout")  # an older request's failure: ignored
    with pytest.raises(SchemaChangeFailed, match="timeout"):
        change.failed(6, "timeout")
    change.fence()
    assert change.state == Schema.IDLE and not change.quiesced(6)
