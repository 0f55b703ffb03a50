"""The engine's shared timers for managed readers: one thread per worker process runs every
reader's due callbacks (a paced reader's availability, ``ManagedReader.is_available``), so a
reader waiting for its next rows costs a heap entry, not a thread.

A callback runs on the timer thread and must be quick and never block: it completes a future,
whose done-callbacks admit an ``AVAILABLE`` command into a mailbox (non-blocking admission).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("keel.sourceruntime.timers")


@dataclass(order=True)
class Timer:
    due: float
    order: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        """It will not run (attribute writes: safe from any thread). Its callback is let go at
        once: a cancelled timer stays in the heap until it is due, and what its callback holds
        (a future, and through it a reader's mailbox) is not kept alive that long."""
        self.cancelled = True
        self.callback = _nothing


def _nothing() -> None:
    """A cancelled timer's callback."""


class Timers:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._heap: list[Timer] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_in(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` on the timer thread ``delay`` seconds from now (at once if due)."""
        timer = Timer(self.clock() + max(delay, 0.0), next(self._order), callback)
        with self._cond:
            heapq.heappush(self._heap, timer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="source-timers", daemon=True)
                self._thread.start()
            self._cond.notify()
        return timer

    def __len__(self) -> int:
        with self._cond:
            return sum(not t.cancelled for t in self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0].due - self.clock()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                timer = heapq.heappop(self._heap)
            try:
                timer.callback()
            except Exception:
                log.exception("a source timer's callback failed")


#: This process's timers (made on first use), and the lock that makes one.
_shared: dict[str, Timers] = {}
_guard = [threading.Lock()]


def timers() -> Timers:
    """This process's shared timers."""
    with _guard[0]:
        if "timers" not in _shared:
            _shared["timers"] = Timers()
        return _shared["timers"]


def _forked() -> None:
    """A forked child has none of its parent's threads: it makes timers of its own."""
    _shared.clear()
    _guard[0] = threading.Lock()


os.register_at_fork(after_in_child=_forked)
