"""A reader whose poll call ignores its wakeup (tests/blocking_readers.py StuckReader: it waits
until the test releases it) is caught by the conformance suite, and at runtime the watchdog
fails it once its call has not returned within ``poll.cancellation-timeout`` of the wakeup; a
reader whose wait ends with its wakeup passes the same checks."""

from __future__ import annotations

import time

import pytest

from engine.connectors.fake_managed import CAPABILITY
from engine.sourceruntime.choices import CommandKind
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.watchdog import CANCELLATION_OPTION, PollWatchdog
from tests import source_conformance as suite
from tests.blocking_readers import ROWS, LoopThread, StuckReader, WaitingReader, splits
from tests.clusterkit import wait_for


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def made():
    """Readers the test makes, released when it ends (a stuck call's thread then ends too)."""
    readers: list[WaitingReader] = []
    yield readers
    for reader in readers:
        reader.release()


def subject(kind: type[WaitingReader], made: list) -> suite.Subject:
    def make() -> WaitingReader:
        made.append(kind())
        return made[-1]

    return suite.Subject(make=make, splits=splits(2), rows_per_split=ROWS, capability=CAPABILITY)


def test_the_suite_catches_a_reader_that_blocks_ignoring_its_wakeup(made):
    stuck = subject(StuckReader, made)
    with pytest.raises(AssertionError, match="did not return within"):
        suite.test_a_poll_with_splits_assigned_never_blocks_and_keeps_to_its_soft_duration(stuck)
    with pytest.raises(AssertionError, match="did not return within the hard budget"):
        suite.test_a_poll_in_progress_returns_within_the_hard_budget_after_wakeup(stuck)


def test_a_reader_whose_wait_ends_with_its_wakeup_returns_within_the_hard_budget(made):
    """The suite's cancellation check tells the two apart: waiting is not blocking for good."""
    suite.test_a_poll_in_progress_returns_within_the_hard_budget_after_wakeup(
        subject(WaitingReader, made)
    )
    assert made[0].wakeups >= 1


def stuck_in_poll(made: list, clock, hard: float) -> tuple[StuckReader, LoopThread, list[str]]:
    """A loop on its own thread whose reader is stuck in its first poll call (a cancellation
    timeout of 30 s on ``clock``), and the watch's stuck verdicts as they come."""
    reader = StuckReader()
    made.append(reader)
    run = LoopThread(reader, PollLimits(hard=hard, cancellation_timeout=30.0), clock)
    failures: list[str] = []
    run.loop.watch.on_stuck = failures.append
    run.start(splits())
    assert reader.entered.wait(5)
    return reader, run, failures


def test_a_cancelled_call_that_does_not_return_within_the_timeout_fails_its_task(made):
    """On a clock the test moves: the cancel wakes the call at once; the call is stuck once the
    cancellation timeout has passed since, and the task is failed once, naming the option."""
    clock = Clock()
    reader, run, failures = stuck_in_poll(made, clock, hard=3600.0)
    clock.now = 110.0
    run.box.signal_terminal(CommandKind.CANCEL, "CANCEL")
    assert reader.wakeups == 1  # at once, on the cancelling thread
    run.loop.watch.check(111.0)  # the watchdog's own wakeup of the call, once
    run.loop.watch.check(140.0)  # 30 s after the cancel: not past it
    assert reader.wakeups == 2 and failures == []
    run.loop.watch.check(140.001)
    run.loop.watch.check(150.0)
    assert len(failures) == 1 and CANCELLATION_OPTION in failures[0]
    assert "(30 s)" in failures[0] and "abandoned" in failures[0]
    reader.release()  # the abandoned call returns at last: the loop ends as cancelled
    assert run.closed()


def test_a_call_past_its_hard_budget_that_ignores_its_wakeup_fails_its_task(made):
    clock = Clock()
    reader, run, failures = stuck_in_poll(made, clock, hard=1.0)
    run.loop.watch.check(101.5)  # woken here, past its hard budget
    run.loop.watch.check(131.5)
    run.loop.watch.check(131.5)
    assert (reader.wakeups, run.loop.metrics.hard_wakeups, failures) == (1, 1, [])
    run.loop.watch.check(131.6)
    assert len(failures) == 1 and CANCELLATION_OPTION in failures[0]


def test_the_watchdog_thread_fails_a_stuck_reader_after_a_small_timeout(made):
    """In real time, on the watchdog's own thread: a cancel, then the failure 0.2 s later."""
    reader = StuckReader()
    made.append(reader)
    watchdog = PollWatchdog()
    run = LoopThread(reader, PollLimits(hard=3600.0, cancellation_timeout=0.2))
    failures: list[str] = []
    watchdog.watch(run.loop.watch, failures.append)
    run.start(splits())
    assert reader.entered.wait(5)
    cancelled = time.monotonic()
    run.box.signal_terminal(CommandKind.CANCEL, "CANCEL")
    wait_for(lambda: failures, 10, interval=0.01, what="the cancellation timeout")
    assert time.monotonic() - cancelled >= 0.2
    assert len(failures) == 1 and CANCELLATION_OPTION in failures[0]
    assert reader.entered.is_set()  # still in its call: abandoned, not stopped
    reader.release()
    assert run.closed()
    watchdog.forget(run.loop.watch)
