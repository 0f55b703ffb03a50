"""The coordinator event loop: callbacks serialized on its thread, async work on the shared
pool with results fenced by epoch, COALESCE_ONE, timeouts, cancellation, and timers."""

from __future__ import annotations

from concurrent.futures import Future

from engine.sourceruntime.coordinator import (
    AsyncTaskOptions,
    CoordinatorEventLoop,
    Overlap,
    SharedWorkerPool,
)


class StepPool:
    """The pool, run by hand: submitted work runs when the test says (deterministic)."""

    def __init__(self) -> None:
        self.waiting: list[tuple] = []

    def submit(self, fn) -> Future:
        future = Future()
        self.waiting.append((fn, future))
        return future

    def run_next(self) -> None:
        fn, future = self.waiting.pop(0)
        try:
            future.set_result(fn())
        except Exception as exc:
            future.set_exception(exc)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drain(loop) -> None:
    while loop.step():
        pass


def setup():
    pool, clock = StepPool(), Clock()
    return pool, clock, CoordinatorEventLoop(pool, epoch=1, clock=clock)


def test_a_result_comes_back_on_the_loop_not_on_the_worker():
    pool, _, loop = setup()
    seen = []
    loop.call_async("discover", lambda: ["f1"], lambda result, error: seen.append(result))
    pool.run_next()
    assert seen == []  # the worker finished; nothing touched the enumerator yet
    drain(loop)
    assert seen == [["f1"]]


def test_asking_again_while_it_runs_coalesces_into_one_more_run():
    pool, _, loop = setup()
    seen = []
    for n in range(5):
        loop.call_async("discover", lambda n=n: n, lambda r, e: seen.append(r))
    assert len(pool.waiting) == 1 and loop.metrics["coalesced"] == 4
    pool.run_next()
    drain(loop)  # the first result, then the one coalesced run is submitted
    pool.run_next()
    drain(loop)
    assert seen == [0, 4] and loop.metrics["executions"] == 2
    loop.call_async("x", lambda: 1, seen.append, AsyncTaskOptions(overlap=Overlap.SKIP))
    loop.call_async("x", lambda: 2, seen.append, AsyncTaskOptions(overlap=Overlap.SKIP))
    assert len(pool.waiting) == 1


def test_a_result_of_an_older_epoch_is_fenced():
    pool, _, loop = setup()
    seen = []
    loop.call_async("discover", lambda: "old", lambda r, e: seen.append(r))
    assert loop.new_epoch() == 2
    pool.run_next()
    drain(loop)
    assert seen == [] and loop.metrics["stale_results"] == 1


def test_cancelled_and_timed_out_work_is_never_applied():
    pool, clock, loop = setup()
    seen = []
    loop.call_async("a", lambda: "a", lambda r, e: seen.append(r)).cancel()
    loop.call_async("b", lambda: "b", lambda r, e: seen.append(r), AsyncTaskOptions(timeout=5))
    clock.now = 6
    drain(loop)
    assert loop.metrics["timeouts"] == 1
    pool.run_next(), pool.run_next()
    drain(loop)
    assert seen == [] and loop.metrics["stale_results"] == 2


def test_a_failure_reaches_the_handler_as_an_error():
    pool, _, loop = setup()
    seen = []

    def boom():
        raise OSError("listing failed")

    loop.call_async("discover", boom, lambda r, e: seen.append(type(e).__name__))
    pool.run_next()
    drain(loop)
    assert seen == ["OSError"] and loop.metrics["failures"] == 1


def test_events_run_in_order_and_timers_when_due_once_per_key():
    _, clock, loop = setup()
    order = []
    loop.post(lambda: order.append("register"))
    loop.post(lambda: order.append("split-request"))
    loop.schedule_in_coordinator_thread("tick", 2, lambda: order.append("tick"))
    loop.schedule_in_coordinator_thread("tick", 1, lambda: order.append("tick-again"))
    drain(loop)
    assert order == ["register", "split-request"]
    clock.now = 2
    drain(loop)
    assert order == ["register", "split-request", "tick"] and loop.metrics["coalesced"] == 1
    timer = loop.schedule_in_coordinator_thread("later", 1, lambda: order.append("later"))
    timer.cancel()
    loop.schedule_in_coordinator_thread("other", 1, lambda: order.append("other"))
    loop.new_epoch()  # a failover cancels the timers too
    clock.now = 10
    drain(loop)
    assert order[-1] == "tick"


def test_the_shared_pool_really_runs_work_on_its_own_threads():
    import threading

    pool = SharedWorkerPool(max_workers=2)
    done = threading.Event()
    loop = CoordinatorEventLoop(pool, wakeup=done.set)
    seen = []
    loop.call_async("t", threading.current_thread, lambda r, e: seen.append(r.name))
    assert done.wait(5)
    drain(loop)
    assert seen and seen[0].startswith("source-async")
    pool.executor.shutdown()
