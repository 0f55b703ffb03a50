"""A managed reader's availability future, returned to its event loop as an AVAILABLE command
(engine.sourceruntime.availability), deterministically: a completion between the poll and the
wait is never lost, completions coalesce into one pending command, one refused for capacity
still wakes the loop, a reader without ``is_available`` keeps the loop's own timer, and a paced
FakeSource reader is woken by its future (a timer on the process's shared timers) alone."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from engine.connectors.fake import FakeSource
from engine.connectors.fake_managed import ManagedFakeReader
from engine.jobs.planner import plan_job
from engine.sourceruntime import CommandKind, MailboxLimits, ReaderMailbox, WorkerBudget
from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.lifecycle import Life
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.reader import ReaderEventLoop, rows_of
from tests.source_conformance import admit


class LateRows:
    """A reader with nothing until the test says rows came (``arrive``): its future is done
    from then on. ``early``: the rows come inside ``is_available`` itself, after the poll that
    found nothing and before the loop awaits the future (the window a wakeup is lost in)."""

    def __init__(self, early: bool = False, fresh: bool = False) -> None:
        self.early, self.fresh = early, fresh
        self.rows: list[int] = []
        self.future: Future = Future()
        self.polls = 0

    def add_splits(self, splits):
        pass

    def notify_no_more_splits(self):
        pass

    def poll(self, context):
        self.polls += 1
        rows, self.rows = self.rows, []
        for row in rows:
            context.emit((row,), 8)
        return PollStatus.MORE_AVAILABLE if rows else PollStatus.NOTHING_AVAILABLE

    def is_available(self) -> Future:
        if self.fresh and self.future.done():
            self.future = Future()
        if self.early:
            self.arrive(1)
        return self.future

    def arrive(self, row: int) -> None:
        self.rows.append(row)
        if not self.future.done():
            self.future.set_result(None)

    def snapshot(self):
        return {}

    def wakeup(self):
        pass


def event_loop(reader, limits: MailboxLimits | None = None):
    wake = threading.Event()
    box = ReaderMailbox(1, "1/1", 1, limits or MailboxLimits(), WorkerBudget(10**9), wake.set)
    out: list = []
    loop = ReaderEventLoop(
        box, reader, PollLimits(), out.append, lambda s: None, "d", checkpointing=False
    )
    loop.start()
    return loop, box, wake, out


def steps(loop, n: int = 10) -> None:
    for _ in range(n):
        if not loop.step():
            return


def test_a_completion_between_the_poll_and_the_wait_wakes_the_loop():
    reader = LateRows()
    loop, box, wake, out = event_loop(reader)
    steps(loop)  # polled, found nothing, awaits the future
    assert not loop.available and reader.polls == 1 and loop.retry_at is None
    wake.clear()
    assert not loop.step()  # nothing to do: the task group's thread is about to wait
    reader.arrive(7)  # ... and the rows come now, on another thread's time
    assert wake.is_set()  # so the wait returns at once
    assert box.stats()["commands"] == 1  # one AVAILABLE, in the reader's own mailbox
    steps(loop)
    assert rows_of(out) == [(7,)] and loop.availability.wakeups == 1


def test_a_future_done_before_the_loop_awaits_it_is_not_lost():
    reader = LateRows(early=True)  # done between the poll and the done-callback
    loop, box, wake, out = event_loop(reader)
    assert loop.step()  # the poll finds nothing; awaiting the done future admits AVAILABLE
    assert not loop.available and box.stats()["commands"] == 1 and wake.is_set()
    steps(loop, 3)
    assert rows_of(out) == [(1,)] and loop.availability.wakeups >= 1


def test_completions_coalesce_into_one_pending_available():
    reader = LateRows(fresh=True)
    loop, box, _wake, _out = event_loop(reader)
    steps(loop)
    for _ in range(5):  # five completions before the loop runs again
        loop.availability.completed(Future())
    assert box.stats()["commands"] == 1  # bounded: one pending
    assert box.stats()["admissions"] == {"ACCEPTED": 1, "DUPLICATE": 4}
    assert loop.availability.metrics() == {
        "wakeups": 0,
        "admitted": 1,
        "coalesced": 4,
        "refused": 0,
    }
    steps(loop, 2)
    assert loop.availability.wakeups == 1 and box.stats()["commands"] == 0
    loop.availability.completed(Future())  # applied: the next one is admitted again
    assert loop.availability.admitted == 2


def test_a_completion_the_full_mailbox_refuses_still_wakes_the_loop():
    reader = LateRows()
    # no normal capacity at all: only the checkpoint path's controls are admitted
    limits = MailboxLimits(max_commands=4, reserved_commands=4)
    loop, _box, wake, out = event_loop(reader, limits)
    steps(loop)
    wake.clear()
    reader.arrive(3)
    assert loop.availability.refused == 1 and wake.is_set()
    steps(loop)
    assert rows_of(out) == [(3,)]


def test_a_reader_without_a_future_keeps_the_loops_timer():
    class Paced:  # no is_available: the loop's own timer on its retry_at
        retry_at: float | None = None

        def add_splits(self, splits):
            pass

        def notify_no_more_splits(self):
            pass

        def snapshot(self):
            return {}

        def wakeup(self):
            pass

        def poll(self, context):
            self.retry_at = time.monotonic() + 60.0
            return PollStatus.NOTHING_AVAILABLE

    reader = Paced()
    loop, box, _wake, _out = event_loop(reader)
    steps(loop)
    assert loop.retry_at == reader.retry_at and box.stats()["commands"] == 0
    assert 59.0 < loop.idle_for(120.0) <= 60.0


def paced_source(rows: int, splits: int, rate: int) -> FakeSource:
    plan = plan_job(
        f"source {{ FakeSource {{ row.num = {rows}, split.num = {splits},"
        f" rows.per-second = {rate}, schema {{ fields {{ id = bigint }} }} }} }}\n"
        "sink { Blackhole { } }"
    )
    node = plan.pipelines[0].source
    return FakeSource(node.config, node.path)


def test_a_paced_fakesource_reader_is_woken_by_its_future_alone():
    """Idle waits of 10 s: only AVAILABLE commands (the shared timers completing the reader's
    futures) can wake the loop in time; every row arrives, the loop never keeps a timer."""
    source = paced_source(rows=60, splits=2, rate=200)
    reader = ManagedFakeReader(source, "BATCH")
    loop, box, wake, out = event_loop(reader)
    for split in source.create_splits("BATCH"):
        admit(box, CommandKind.ASSIGN_SPLITS, {"splits": [split]})
    admit(box, CommandKind.NO_MORE_SPLITS)
    deadline = time.monotonic() + 30
    while loop.life.state != Life.CLOSED:
        assert time.monotonic() < deadline, (rows_of(out), loop.availability.metrics())
        wake.clear()
        if not loop.step():
            assert loop.retry_at is None  # the future is the reader's availability
            wake.wait(loop.idle_for(10.0))
    ids = sorted(row[0] for row in rows_of(out))
    assert ids == list(range(60))
    assert loop.availability.wakeups >= 2  # 30 rows a split at 200/s: several waits each
    timer_threads = [t for t in threading.enumerate() if t.name == "source-timers"]
    assert len(timer_threads) == 1  # the process's one, whatever the readers


def test_an_ended_loop_cancels_the_paced_readers_timer_and_admits_nothing():
    """Cancelled while a paced FakeSource reader waits for its next rows: its availability
    future is cancelled with the loop, which cancels its timer on the shared timers (and lets
    go of what the timer held); a completion that comes anyway admits nothing."""
    source = paced_source(rows=600, splits=1, rate=1)  # its next row a second away
    reader = ManagedFakeReader(source, "STREAMING")
    loop, box, _wake, _out = event_loop(reader)
    admit(box, CommandKind.ASSIGN_SPLITS, {"splits": source.create_splits("STREAMING")})
    deadline = time.monotonic() + 10
    while reader._available is None or reader._available[2] is None:
        assert time.monotonic() < deadline
        loop.step()
    future, _at, timer = reader._available
    assert not loop.available and not future.done() and not timer.cancelled
    box.signal_terminal(CommandKind.CANCEL, "CANCEL")
    loop.step()
    assert loop.life.state == Life.CLOSED
    assert future.cancelled() and timer.cancelled  # the timer will not run
    assert timer.callback() is None  # and holds nothing of the reader any more
    admissions = dict(box.stats()["admissions"])
    loop.availability.completed(Future())  # a late completion, after the end
    assert box.stats()["admissions"] == admissions and loop.availability.admitted == 0


def test_a_closed_loops_availability_admits_nothing_into_its_mailbox():
    reader = LateRows()
    loop, box, _wake, _out = event_loop(reader)
    steps(loop)  # awaits the future
    loop.availability.close()  # as the loop does once it is CLOSED, whatever the reason
    reader.arrive(5)  # the rows come after the end: no mailbox reader would take them
    assert reader.future.cancelled() and box.stats()["commands"] == 0
