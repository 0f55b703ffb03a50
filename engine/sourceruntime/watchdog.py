"""The poll watchdog: what interrupts a managed reader's poll call that runs too long, and fails
its task group when the call does not return after that.

A reader event loop marks each poll turn's start (a call's, then each turn it begins within the
call: ``PollContext.begin``) and each call's end on its ``PollWatch`` (an attribute write each:
no lock on the hot path). One watchdog thread per worker process looks at every watch a few
times per hard budget: a turn in progress past ``poll.hard-duration`` is woken once
(``hardWakeups``; a call of many turns, each within its soft budget, is not); a call in
progress when the terminal signal is raised (cancel, fatal failure) was woken at once by the
signalling thread, and is woken again once by the watchdog (a call that started just after the
signal cleared that wakeup). A call that has not returned within
``poll.cancellation-timeout`` of its first wakeup is stuck: the watch's ``on_stuck`` fails the
task group, and the watchdog forgets the watch. Python cannot stop a thread, so a stuck call's
thread is abandoned: whatever it does once the call returns is fenced by its attempt.

The watchdog thread never calls a reader's own ``wakeup()`` itself: one that blocks (against its
contract) would blind the watchdog to every other reader. Each goes on a short-lived daemon
thread, and while a reader's previous one has not returned it gets the flag only.

A wakeup is a ``Wakeup`` flag the poll context reads at every turn and record boundary, set by
the runtime before it calls the reader's own ``wakeup()`` (which a reader that waits for
something must make end its wait).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from engine.sourceruntime.limits import PollLimits

log = logging.getLogger("keel.sourceruntime.watchdog")

#: The option a stuck poll call's failure names.
CANCELLATION_OPTION = "engine.source-runtime.poll.cancellation-timeout"
#: The watchdog looks at every watch this many times per hard budget (or cancellation
#: timeout, if shorter), within these bounds (seconds).
CHECKS_PER_BUDGET = 10
SHORTEST_TICK, LONGEST_TICK = 0.005, 0.1


class PollStuck(Exception):
    """A poll call did not return within the cancellation timeout of its wakeup."""


class Wakeup:
    """A reader's wakeup: set from any thread (one attribute write, so idempotent and safe from
    any thread), read by the poll context at its turn and record boundaries, cleared by the
    event loop as each poll call starts (a wakeup interrupts the call in progress only)."""

    __slots__ = ("woken",)

    def __init__(self) -> None:
        self.woken = False

    def set(self) -> None:
        self.woken = True


def wake_of(reader: Any) -> Wakeup:
    """The flag ``reader``'s own ``wakeup()`` sets, if it keeps one (``reader.wake``, as
    ``SplitOffsets`` does); otherwise one only the runtime sets."""
    wake = getattr(reader, "wake", None)
    return wake if isinstance(wake, Wakeup) else Wakeup()


class PollWatch:
    """One reader event loop's poll call in progress, as the watchdog sees it.

    The loop writes ``started`` (the call's start on its clock) before each poll call and None
    after it, and the poll context writes each turn's start as the turn begins within the call;
    the watchdog compares starts to tell turns apart (a turn it woke either ran past the hard
    budget, so the next one starts later, or was ended by the wakeup or the terminal signal,
    after which no turn starts in that call)."""

    __slots__ = (
        "clock",
        "hard",
        "metrics",
        "off_thread",
        "on_stuck",
        "reader_wakeup",
        "started",
        "stuck",
        "terminal_at",
        "timeout",
        "wake",
        "waking",
        "woken_at",
        "woken_call",
    )

    def __init__(
        self,
        reader_wakeup: Callable[[], None],
        wake: Wakeup,
        limits: PollLimits,
        clock: Callable[[], float],
        metrics: Any,
    ) -> None:
        self.reader_wakeup, self.wake, self.clock = reader_wakeup, wake, clock
        self.metrics = metrics  # its hard_wakeups counts the calls woken past the hard budget
        self.hard, self.timeout = limits.hard, limits.cancellation_timeout
        self.started: float | None = None
        self.terminal_at: float | None = None  # when the terminal signal was raised
        self.woken_call: float | None = None  # the start of the call last woken, and when
        self.woken_at = 0.0
        self.stuck = False
        #: Whether the watchdog's wakeups call ``reader_wakeup`` on a thread of their own (set
        #: by ``PollWatchdog.watch``), and that thread while it runs.
        self.off_thread = False
        self.waking: threading.Thread | None = None
        #: Told (on the watchdog's thread, once) that a call did not return in time.
        self.on_stuck: Callable[[str], None] = lambda error: None

    def interrupt(self) -> None:
        """End the poll call in progress at its next boundary; the reader's ``wakeup()`` ends
        a wait it is in."""
        self.wake.woken = True
        self.reader_wakeup()

    def terminal(self) -> None:
        """The terminal signal was raised (on the thread that raised it): a poll call in
        progress is woken at once."""
        if self.terminal_at is None:
            self.terminal_at = self.clock()
        if self.started is not None:
            self.interrupt()

    def _watchdog_interrupt(self) -> None:
        """``interrupt``, with the reader's ``wakeup()`` off the watchdog's thread once watched
        (a blocking one holds only its own thread; while it has not returned, the flag only)."""
        if not self.off_thread:
            self.interrupt()
            return
        self.wake.woken = True
        if self.waking is not None and self.waking.is_alive():
            return
        self.waking = threading.Thread(
            target=_call_wakeup, args=(self.reader_wakeup,), name="source-wakeup", daemon=True
        )
        self.waking.start()

    def check(self, now: float) -> None:
        """Wake the call in progress once if it is past its hard budget or the terminal signal
        is raised; fail the task group if a woken call has not returned within the cancellation
        timeout (of its first wakeup, or of the terminal signal if that came first)."""
        started = self.started
        if started is None or self.stuck:
            return
        if self.woken_call != started:
            if self.terminal_at is None:
                if now - started <= self.hard:
                    return
                self.metrics.hard_wakeups += 1
            self.woken_call, self.woken_at = started, now
            self._watchdog_interrupt()
            return
        since = self.woken_at
        if self.terminal_at is not None:
            since = min(since, max(self.terminal_at, started))
        if now - since > self.timeout and self.started == started:
            self.stuck = True
            self.on_stuck(
                f"a poll call did not return within {CANCELLATION_OPTION} ({self.timeout:g} s) "
                "of its wakeup: the reader is stuck, its thread abandoned"
            )


class PollWatchdog:
    """The worker process's one watchdog thread (``watchdog()``), started with the first watch
    and parked while there is none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: list[PollWatch] = []
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, watch: PollWatch, on_stuck: Callable[[str], None]) -> None:
        watch.on_stuck, watch.off_thread = on_stuck, True
        with self._lock:
            self._watches.append(watch)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="source-poll-watchdog", daemon=True
                )
                self._thread.start()
        self._changed.set()

    def forget(self, watch: PollWatch) -> None:
        with self._lock:
            if watch in self._watches:
                self._watches.remove(watch)

    def tick(self) -> float | None:
        """How long to wait between two looks (None: nothing to watch)."""
        with self._lock:
            budgets = [min(w.hard, w.timeout) for w in self._watches]
        if not budgets:
            return None
        return min(max(min(budgets) / CHECKS_PER_BUDGET, SHORTEST_TICK), LONGEST_TICK)

    def check_all(self) -> None:
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            try:
                watch.check(watch.clock())
            except Exception:  # one reader's failing wakeup must not blind the others'
                log.exception("the poll watchdog could not handle a reader")
            if watch.stuck:  # failed and abandoned: nothing more to judge of it
                self.forget(watch)

    def _run(self) -> None:
        while True:
            self._changed.wait(self.tick())
            self._changed.clear()
            self.check_all()


def _call_wakeup(wakeup: Callable[[], None]) -> None:
    try:
        wakeup()
    except Exception:
        log.exception("a reader's wakeup failed")


_watchdog: PollWatchdog | None = None
_lock = threading.Lock()


def watchdog() -> PollWatchdog:
    """This process's poll watchdog."""
    global _watchdog
    with _lock:
        if _watchdog is None:
            _watchdog = PollWatchdog()
        return _watchdog


def _forked() -> None:
    """A forked child has none of its parent's threads: it starts a watchdog of its own."""
    global _watchdog, _lock
    _watchdog, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forked)
