"""The poll watchdog wakes a managed reader's poll call while it runs: once per call past the
hard budget (counted as hardWakeups), at once when the terminal signal is raised during the
call, and again once if the call started just after the signal and cleared its wakeup. Readers
here wait in ``poll`` until woken (tests/blocking_readers.py); the loop runs on a thread of its
own, and the watchdog's looks are made by the test on a clock it moves, or by its thread."""

from __future__ import annotations

import threading
import time

import pytest

from engine.sourceruntime.choices import CommandKind, PollStatus
from engine.sourceruntime.lifecycle import Life
from engine.sourceruntime.limits import MailboxLimits, PollLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from engine.sourceruntime.reader import TURNS_PER_STEP, Metrics, PollContext, ReaderEventLoop
from engine.sourceruntime.watchdog import (
    LONGEST_TICK,
    SHORTEST_TICK,
    PollWatch,
    PollWatchdog,
    Wakeup,
)
from tests.blocking_readers import ROWS, LoopThread, WaitingReader, splits
from tests.clusterkit import wait_for


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_call_past_its_hard_budget_is_woken_once_and_counted():
    clock = Clock()
    reader = WaitingReader()
    run = LoopThread(reader, PollLimits(hard=1.0), clock).start(splits(2))
    assert reader.entered.wait(5)
    watch = run.loop.watch
    assert watch.started == 100.0
    watch.check(101.0)  # at the budget, not past it
    assert (reader.wakeups, run.loop.metrics.hard_wakeups) == (0, 0)
    watch.check(101.001)
    assert run.closed(), "the woken call never returned"
    assert (reader.wakeups, run.loop.metrics.hard_wakeups) == (1, 1)
    assert sorted(run.out) == [(s * 1000 + n,) for s in (0, 1) for n in range(ROWS)]
    assert watch.started is None  # the loop marked the call's end


def test_the_watchdog_thread_wakes_a_waiting_call_on_the_real_clock():
    reader = WaitingReader()
    watchdog = PollWatchdog()
    run = LoopThread(reader, PollLimits(hard=0.05))
    stuck: list[str] = []
    watchdog.watch(run.loop.watch, stuck.append)
    started = time.monotonic()
    run.start(splits())
    assert run.closed(), "the watchdog never woke the call"
    assert time.monotonic() - started >= 0.05
    assert run.loop.metrics.hard_wakeups == 1 and reader.wakeups >= 1 and not stuck
    watchdog.forget(run.loop.watch)
    assert watchdog.tick() is None  # nothing left to watch: the thread parks


def test_the_terminal_signal_wakes_a_call_in_progress_at_once():
    """No watchdog at all, and a call an hour from its hard budget: cancelling the reader
    wakes it on the cancelling thread, before the cancel returns."""
    reader = WaitingReader()
    run = LoopThread(reader, PollLimits(hard=3600.0)).start(splits())
    assert reader.entered.wait(5)
    run.box.signal_terminal(CommandKind.CANCEL, "CANCEL")
    assert reader.wakeups >= 1
    assert run.closed() and run.loop.life.state == Life.CLOSED
    assert run.loop.metrics.hard_wakeups == 0


def test_a_call_that_cleared_the_terminal_wakeup_is_woken_again_by_the_watchdog():
    """The signal lands as a call starts, before the call forgets older wakeups: the call waits
    on, and the watchdog's next look wakes it (once) without waiting for the hard budget."""
    clock = Clock()
    reader = WaitingReader()
    run = LoopThread(reader, PollLimits(hard=3600.0), clock)
    reader.on_enter = lambda: run.box.signal_terminal(CommandKind.CANCEL, "CANCEL")
    run.start(splits())
    assert reader.entered.wait(5)
    assert reader.wakeups == 1  # the wakeup the call then cleared
    assert not run.closed(within=0.05)  # still waiting
    run.loop.watch.check(clock.now)
    assert run.closed()
    assert reader.wakeups == 3  # the one cleared, the watchdog's, the loop's as it terminates
    assert run.loop.metrics.hard_wakeups == 0  # a terminal wakeup, not a hard one


def test_a_wakeup_sets_the_flag_the_poll_context_reads_and_each_call_clears_it():
    reader = WaitingReader()
    watch = PollWatch(reader.wakeup, reader.wake, PollLimits(), Clock(), None)
    watch.started = 100.0
    watch.terminal()
    assert reader.wake.woken and reader.wakeups == 1
    run = LoopThread(WaitingReader(), PollLimits(hard=3600.0))
    run.loop.wake.woken = True  # a wakeup left over from before the next call
    run.start(splits())
    assert run.loop.reader.entered.wait(5) and not run.loop.wake.woken
    run.loop.reader.release()
    assert run.closed()


def test_the_watchdog_looks_a_few_times_per_budget_within_bounds():
    watchdog = PollWatchdog()
    assert watchdog.tick() is None
    watch = PollWatch(lambda: None, Wakeup(), PollLimits(hard=1.0), Clock(), None)
    watchdog._watches.append(watch)  # registered without starting its thread
    assert watchdog.tick() == LONGEST_TICK
    short = PollWatch(
        lambda: None,
        Wakeup(),
        PollLimits(hard=5.0, cancellation_timeout=0.2),
        Clock(),
        None,
    )
    watchdog._watches.append(short)
    assert watchdog.tick() == 0.02  # a tenth of the shortest budget (its cancellation timeout)
    watchdog._watches.append(PollWatch(lambda: None, Wakeup(), PollLimits(hard=0.001), Clock(), 0))
    assert watchdog.tick() == SHORTEST_TICK


class CheapTurns:
    """Each turn takes a tenth of a second on the test's clock (within a soft budget of 0.2 s)
    and goes on into the next turn in the same call; the watchdog looks after every turn."""

    STATE_VERSION = 1

    def __init__(self, clock: Clock) -> None:
        self.clock, self.watch, self.starts = clock, None, []
        self.wake = Wakeup()

    def add_splits(self, splits) -> None: ...
    def notify_no_more_splits(self) -> None: ...
    def snapshot(self) -> dict:
        return {}

    def wakeup(self) -> None: ...

    def poll(self, context: PollContext) -> PollStatus:
        while True:
            self.clock.now += 0.1
            context.emit((len(self.starts),))
            self.watch.check(self.clock.now)  # the watchdog's look, mid-call
            self.starts.append(self.watch.started)
            if not context.next_turn():
                return PollStatus.MORE_AVAILABLE


def test_a_call_of_many_turns_each_within_its_budgets_is_never_woken():
    """256 turns of 0.1 s are 25.6 s in one call, 25 hard budgets: the watchdog judges the
    turn in progress (its start, which each turn writes on the watch), not the call."""
    clock = Clock()
    reader = CheapTurns(clock)
    box = ReaderMailbox(1, "1/1", 1, MailboxLimits(), WorkerBudget(10**9), clock=clock)
    loop = ReaderEventLoop(
        box, reader, PollLimits(soft=0.2, hard=1.0), [].extend, lambda s: None, "d", clock=clock
    )
    reader.watch = loop.watch
    loop.start()
    assert loop.step()
    assert loop.metrics.poll_turns == TURNS_PER_STEP == len(reader.starts)
    assert loop.metrics.hard_wakeups == 0 and not loop.wake.woken
    assert reader.starts[-1] == pytest.approx(100.0 + 0.1 * (TURNS_PER_STEP - 1))
    assert loop.watch.started is None


def test_a_stuck_watch_is_forgotten_once_its_task_group_is_failed():
    clock = Clock()
    watchdog = PollWatchdog()
    watch = PollWatch(
        lambda: None, Wakeup(), PollLimits(hard=1.0, cancellation_timeout=2.0), clock, Metrics()
    )
    watch.started = 100.0
    stuck: list[str] = []
    watchdog.watch(watch, stuck.append)
    clock.now = 101.5
    wait_for(lambda: watch.woken_call == 100.0, 5, interval=0.01, what="the wakeup")
    clock.now = 104.0
    wait_for(lambda: stuck, 5, interval=0.01, what="the stuck verdict")
    assert len(stuck) == 1 and watchdog.tick() is None  # its watch is gone


def test_a_reader_whose_wakeup_blocks_does_not_blind_the_watchdog_to_the_others():
    clock = Clock(200.0)
    release, woken = threading.Event(), threading.Event()
    calls: list[str] = []

    def blocking() -> None:
        calls.append("blocking")
        release.wait()

    watchdog = PollWatchdog()
    watches = [
        PollWatch(blocking, Wakeup(), PollLimits(hard=1.0), clock, Metrics()),
        PollWatch(woken.set, Wakeup(), PollLimits(hard=1.0), clock, Metrics()),
    ]
    try:
        for watch in watches:
            watch.started = 100.0
            watchdog.watch(watch, lambda error: None)
        assert woken.wait(5), "the watchdog is stuck in another reader's wakeup"
        assert all(w.wake.woken for w in watches)
        watchdog.forget(watches[0])
        watches[0].started = 150.0  # its next call, past its budget: its wakeup still blocks
        watches[0].check(clock.now)
        assert calls == ["blocking"] and watches[0].wake.woken  # the flag, no second thread
    finally:
        release.set()
