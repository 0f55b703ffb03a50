"""A reader's schema change through the event loop, deterministically: a connector's request
stops polling, asks for a checkpoint, binds the next barrier (whose snapshot holds the new
schema), and applies once that checkpoint completed; abort, timeout, an overlapping request and
a sink that cannot follow fail the reader; a sink not ready yet is tried again; cancel fences."""

from __future__ import annotations

import pytest

from engine.sourceruntime import CommandKind, MailboxLimits, ReaderMailbox, WorkerBudget
from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.lifecycle import Life, Schema, SchemaChangeFailed
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.reader import ReaderEventLoop
from engine.sourceruntime.schema_change import SchemaChangePending
from tests.source_conformance import envelope_for
from tests.test_source_reader_loop import Clock

OLD = [["id", "bigint"]]
NEW = [["id", "bigint"], ["age", "bigint"]]


class ChangingReader:
    """Ten records, then a file with a new column: it asks for ``NEW`` before emitting any of
    the ten after, which it reads only once the change applied."""

    def __init__(self) -> None:
        self.read, self.schema, self.schema_request = 0, OLD, None
        self.polls = 0

    def add_splits(self, splits):
        pass

    def notify_no_more_splits(self):
        pass

    def poll(self, context):
        self.polls += 1
        if self.read == 10 and self.schema != NEW:
            self.schema_request = NEW
            context.end_step()
            return PollStatus.MORE_AVAILABLE
        if self.read >= 20:
            return PollStatus.NOTHING_AVAILABLE
        context.emit((self.read,), 8)
        self.read += 1
        return PollStatus.MORE_AVAILABLE

    def snapshot(self):
        return {"read": self.read}

    def wakeup(self):
        pass

    def schema_changed(self, schema):
        self.schema = schema


class Harness:
    def __init__(self, checkpointing: bool = True, timeout: float = 60.0) -> None:
        self.clock = Clock()
        self.box = ReaderMailbox(
            1, "1/1", 2, MailboxLimits(), WorkerBudget(10**9), clock=self.clock
        )
        self.reader = ChangingReader()
        self.out, self.snaps, self.asked, self.applied = [], [], 0, []
        self.pending = 0  # how many applies answer "not ready yet" (a lock held)
        self.uncommitted = 0  # ... and "the old schema's checkpoint is not committed yet"
        self.refuse: Exception | None = None
        self.loop = ReaderEventLoop(
            self.box,
            self.reader,
            PollLimits(max_records=1, schema_change_timeout=timeout),
            self.out.extend,
            self.snaps.append,
            "digest",
            clock=self.clock,
            checkpointing=checkpointing,
            request_checkpoint=self._ask,
            apply_schema=self._apply,
        )
        self.loop.start()

    def _ask(self) -> None:
        self.asked += 1

    def _apply(self, schema) -> None:
        if self.refuse is not None:
            raise self.refuse
        if self.uncommitted:
            self.uncommitted -= 1
            raise SchemaChangePending("not committed yet", backoff=False)
        if self.pending:
            self.pending -= 1
            raise SchemaChangePending("a lock is held")
        self.applied.append(schema)

    def send(self, kind, checkpoint: int) -> None:
        self.box.admit(envelope_for(self.box, kind, {"checkpoint": checkpoint}, 2))

    def requested_and_completed(self) -> None:
        """The reader asks for its change, then checkpoint 1 is cut and completes (its two
        controls admitted, not yet applied)."""
        self.steps()
        self.send(CommandKind.CHECKPOINT, 1)
        self.send(CommandKind.CHECKPOINT_COMPLETE, 1)

    def steps(self, n: int = 200) -> None:
        for _ in range(n):
            if not self.loop.step():
                return


def test_a_request_stops_polling_binds_the_next_barrier_and_applies_after_its_completion():
    h = Harness()
    h.steps()
    assert h.reader.read == 10 and h.asked == 1
    assert h.loop.schema.state == Schema.TRIGGER_REQUESTED
    polls = h.reader.polls
    h.steps()  # nothing runs while it waits: no poll turn
    assert h.reader.polls == polls and h.applied == []
    h.send(CommandKind.CHECKPOINT, 5)
    h.steps()
    assert h.loop.schema.state == Schema.WAITING_END and h.loop.schema.checkpoint == 5
    assert h.snaps[-1].schema == NEW and h.snaps[-1].state == {"read": 10}
    assert h.reader.polls == polls and h.applied == []
    h.send(CommandKind.CHECKPOINT_COMPLETE, 5)
    h.steps()
    assert h.applied == [NEW] and h.reader.schema == NEW
    assert h.loop.schema.state == Schema.IDLE and h.reader.read == 20
    h.send(CommandKind.CHECKPOINT, 6)
    h.steps()
    assert h.snaps[-1].schema == NEW  # in effect now: every later snapshot records it
    assert h.loop.schema_driver.changes == 1


def test_a_completion_of_an_earlier_checkpoint_does_not_end_it():
    h = Harness()
    h.send(CommandKind.CHECKPOINT, 3)  # applied before the request: not the schema checkpoint
    h.steps()
    h.send(CommandKind.CHECKPOINT, 4)
    h.steps()
    assert h.loop.schema.checkpoint == 4
    h.send(CommandKind.CHECKPOINT_COMPLETE, 3)
    h.steps()
    assert h.applied == [] and h.loop.schema.state == Schema.WAITING_END
    h.send(CommandKind.CHECKPOINT_COMPLETE, 4)
    h.steps()
    assert h.applied == [NEW]


def test_the_schema_checkpoints_abort_fails_the_reader():
    h = Harness()
    h.steps()
    h.send(CommandKind.CHECKPOINT, 7)
    h.steps()
    h.send(CommandKind.CHECKPOINT_ABORT, 7)
    with pytest.raises(SchemaChangeFailed, match="schema checkpoint 7 was aborted"):
        h.steps()


def test_past_the_timeout_the_reader_fails_naming_the_option():
    h = Harness(timeout=30.0)
    h.steps()
    h.clock.advance(29.0)
    h.steps()  # within it: waits
    h.clock.advance(2.0)
    with pytest.raises(SchemaChangeFailed, match=r"schema-change\.timeout"):
        h.steps()


def test_a_sink_not_ready_is_tried_again_and_one_that_cannot_follow_fails():
    h = Harness()
    h.pending = 3
    h.requested_and_completed()
    h.steps()  # the two controls, and a first try: not ready
    assert h.applied == [] and h.loop.schema_driver.retries == 1
    h.steps()  # backing off: no second try before its time
    assert h.loop.schema_driver.retries == 1
    for _ in range(3):  # each back-off passed: tried again
        h.clock.advance(5.0)
        h.steps()
    assert h.applied == [NEW] and h.loop.schema_driver.retries == 3

    h = Harness()
    h.refuse = RuntimeError("sink[0]: the LocalFile sink cannot follow a schema change")
    h.requested_and_completed()
    with pytest.raises(SchemaChangeFailed, match=r"schema change failed: sink\[0\]: the LocalFile"):
        h.steps()


def test_without_checkpoints_it_applies_at_once():
    h = Harness(checkpointing=False)
    h.steps()
    assert h.asked == 0 and h.applied == [NEW] and h.reader.read == 20


def test_an_overlapping_request_fails_and_a_cancel_fences_the_request():
    h = Harness()
    h.steps()
    h.reader.schema_request = NEW  # a second request while the first is under way
    with pytest.raises(SchemaChangeFailed, match="already under way"):
        h.loop.schema_driver.after_poll()

    h = Harness()
    h.steps()
    h.box.signal_terminal(CommandKind.CANCEL, "cancelled")
    h.steps()
    assert h.loop.life.state == Life.CLOSED and h.loop.schema.state == Schema.IDLE
    h.loop.schema_driver.completed(99)  # a late callback changes nothing
    assert h.applied == [] and h.loop.schema_driver.pending is None


def test_an_uncommitted_checkpoint_is_waited_for_step_by_step_without_back_off():
    h = Harness()
    h.uncommitted = 5
    h.requested_and_completed()
    for _ in range(8):  # the two controls, five waits, the apply: no clock advance needed
        h.loop.step()
    assert h.applied == [NEW] and h.loop.schema_driver.retries == 0
