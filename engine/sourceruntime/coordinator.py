"""The coordinator event loop and its scheduler: the enumerator's callbacks, serialized, with
slow work (split discovery) on a shared bounded pool of engine workers.

Everything that touches the enumerator's state runs on the loop's thread, one event at a time:
posted events (registrations, split requests, checkpoint callbacks) and due timers. ``call_async``
runs a callable on the pool and hands its result back to the loop, fenced by the coordinator
epoch: a result of an older epoch, of a cancelled task or of one that timed out is dropped and
counted, never applied. A key has at most one run in flight; asking again while it runs
coalesces into one more run (COALESCE_ONE). ``schedule_in_coordinator_thread`` runs a task on
the loop after a delay, once per key at a time (no implicit re-entry; a fixed-delay repeat is
the task scheduling itself again).
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Overlap(StrEnum):
    COALESCE_ONE = "COALESCE_ONE"  # one more run after the current one, however often asked
    SKIP = "SKIP"  # asking while it runs does nothing


@dataclass(frozen=True)
class AsyncTaskOptions:
    timeout: float = 30.0
    overlap: Overlap = Overlap.COALESCE_ONE


class Cancellable:
    def __init__(self, cancel: Callable[[], None]) -> None:
        self._cancel = cancel

    def cancel(self) -> None:
        self._cancel()


class SharedWorkerPool:
    """The engine's bounded pool for coordinator work, one per worker process."""

    def __init__(self, max_workers: int = 4) -> None:
        self.executor = ThreadPoolExecutor(max_workers, thread_name_prefix="source-async")

    def submit(self, fn: Callable[[], Any]) -> Future:
        # In the asker's context: what the work logs is the asking task group's (its context
        # names it for engine.member.tasklogs), whichever pool thread runs it.
        return self.executor.submit(contextvars.copy_context().run, fn)


@dataclass
class _Run:
    key: str
    epoch: int
    deadline: float
    done: bool = False  # cancelled or timed out: its result is stale
    #: COALESCE_ONE: the one more run asked for while this one ran (work, handler, options).
    again: tuple | None = None


@dataclass(order=True)
class _Timer:
    due: float
    order: int
    key: str = field(compare=False)
    task: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)


class CoordinatorEventLoop:
    def __init__(
        self,
        pool: SharedWorkerPool,
        epoch: int = 1,
        clock: Callable[[], float] = time.monotonic,
        wakeup: Callable[[], None] = lambda: None,
    ) -> None:
        self.pool, self.epoch, self.clock, self.wakeup = pool, epoch, clock, wakeup
        #: executions, coalesced, stale_results, timeouts, failures, events
        self.metrics: Counter[str] = Counter()
        self._events: deque[Callable[[], None]] = deque()
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._timers: list[_Timer] = []
        self._timer_keys: dict[str, _Timer] = {}
        self._order = itertools.count()

    # -- from any thread ---------------------------------------------------------------------

    def post(self, event: Callable[[], None]) -> None:
        with self._lock:
            self._events.append(event)
        self.wakeup()

    # -- from the loop's own thread ------------------------------------------------------------

    def call_async(
        self,
        key: str,
        work: Callable[[], Any],
        handler: Callable[[Any, BaseException | None], None],
        options: AsyncTaskOptions | None = None,
    ) -> Cancellable:
        """Run ``work`` (it gets no loop state: what it needs was captured, immutable, when
        asked) on the pool; ``handler(result, error)`` runs on the loop, unless stale."""
        options = options or AsyncTaskOptions()
        running = self._runs.get(key)
        if running is not None and not running.done:
            if options.overlap == Overlap.COALESCE_ONE:
                running.again = (work, handler, options)  # the newest ask replaces an older
            self.metrics["coalesced"] += 1
            return Cancellable(lambda: self._cancel(key, running))
        run = _Run(key, self.epoch, self.clock() + options.timeout)
        self._runs[key] = run
        self.metrics["executions"] += 1

        def finished(future: Future) -> None:
            error = future.exception()
            result = None if error is not None else future.result()
            self.post(lambda: self._deliver(run, result, error, handler))

        self.pool.submit(work).add_done_callback(finished)
        return Cancellable(lambda: self._cancel(key, run))

    def schedule_in_coordinator_thread(
        self, key: str, delay: float, task: Callable[[], None]
    ) -> Cancellable:
        """Run ``task`` on the loop after ``delay``; a key already scheduled keeps its timer."""
        existing = self._timer_keys.get(key)
        if existing is not None and not existing.cancelled:
            self.metrics["coalesced"] += 1
            return Cancellable(lambda: self._cancel_timer(existing))
        timer = _Timer(self.clock() + delay, next(self._order), key, task)
        self._timer_keys[key] = timer
        heapq.heappush(self._timers, timer)
        return Cancellable(lambda: self._cancel_timer(timer))

    @property
    def in_flight(self) -> int:
        """Async runs not yet handed back (or fenced)."""
        return len(self._runs)

    def new_epoch(self) -> int:
        """A coordinator failover: every run in flight is fenced, every timer cancelled."""
        self.epoch += 1
        for run in self._runs.values():
            run.done = True
        self._runs.clear()
        for timer in self._timers:
            timer.cancelled = True
        self._timer_keys.clear()
        return self.epoch

    def step(self) -> bool:
        """One event, or one due timer, or one timeout; False when there was none."""
        now = self.clock()
        for run in list(self._runs.values()):
            if not run.done and now >= run.deadline:
                run.done = True
                self._runs.pop(run.key, None)
                self.metrics["timeouts"] += 1
                return True
        with self._lock:
            event = self._events.popleft() if self._events else None
        if event is not None:
            self.metrics["events"] += 1
            event()
            return True
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        if self._timers and self._timers[0].due <= now:
            timer = heapq.heappop(self._timers)
            self._timer_keys.pop(timer.key, None)
            timer.task()
            return True
        return False

    def _deliver(self, run: _Run, result: Any, error: BaseException | None, handler) -> None:
        if run.done or run.epoch != self.epoch or self._runs.get(run.key) is not run:
            self.metrics["stale_results"] += 1  # cancelled, timed out, or of an older epoch
            return
        del self._runs[run.key]
        if error is not None:
            self.metrics["failures"] += 1
        handler(result, error)
        if run.again is not None:
            self.call_async(run.key, *run.again)

    def _cancel(self, key: str, run: _Run) -> None:
        run.done = True
        if self._runs.get(key) is run:
            del self._runs[key]

    def _cancel_timer(self, timer: _Timer) -> None:
        timer.cancelled = True
        if self._timer_keys.get(timer.key) is timer:
            del self._timer_keys[timer.key]
