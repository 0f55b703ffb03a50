"""The managed Source runtime beside today's readers, in one process and run.

- Steady-state throughput: FakeSource's rows read by Lane B's data plane itself
  (``run_reader``: ``read`` in batches of the data plane's size) and by Lane A (the reader
  event loop driving FakeSource's managed reader, poll turns of
  ``engine.source-runtime.poll.max-records``, driven step by step as its task group drives it),
  each lane pushing its Arrow batches into the same Blackhole chain (Lane B per batch, Lane A
  per step, as its task group's flush does),
  rounds of 12 M rows (setup, HOCON parsing included, is then a small part of a round),
  alternating rounds, rows/s and the ratio Lane A / Lane B (the design's goal: at least 0.97).
- Admission latency: ``ReaderMailbox.admit`` of assignment commands while the event loop drains
  them, p50 and p99 (goal: p99 at most 5 ms).
- Checkpoint duration: a barrier admitted until its snapshot is taken, p99, in Lane A; in Lane
  B the same snapshot (the offsets) taken between two batches.
- Peak mailbox memory against its bound, with a producer faster than the loop.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")
django.setup()

from engine.connectors.arrowrows import arrow_schema  # noqa: E402
from engine.connectors.batches import limits as batch_limits  # noqa: E402
from engine.connectors.fake import FakeSource  # noqa: E402 - after django.setup()
from engine.connectors.fake_managed import CAPABILITY, ManagedFakeReader  # noqa: E402
from engine.jobs.planner import plan_job  # noqa: E402
from engine.member.dataplane import (  # noqa: E402
    METRICS_INTERVAL,
    Counters,
    compile_chain,
    run_reader,
    sized_parts,
)
from engine.member.gctuning import tune_for_rows  # noqa: E402
from engine.member.step_batches import step_batches  # noqa: E402
from engine.sourceruntime.choices import CommandKind  # noqa: E402
from engine.sourceruntime.envelope import SourceCommandEnvelope  # noqa: E402
from engine.sourceruntime.lifecycle import Life  # noqa: E402
from engine.sourceruntime.limits import MailboxLimits, PollLimits  # noqa: E402
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget  # noqa: E402
from engine.sourceruntime.reader import ReaderEventLoop  # noqa: E402

ROWS = 12_000_000
ROUNDS = 11
#: A checkpoint barrier every this many steps, in the runs that measure checkpoints.
CHECKPOINT_EVERY = 4
#: The steady-state cases: (label, splits, a checkpoint barrier every this many steps or None).
CASES = (
    ("one split", 1, None),
    ("one split, a barrier every 50 steps", 1, 50),
    ("four splits", 4, None),
)
CONTEXT = {"jobId": 1, "pipelineId": 0, "readerIndex": 0, "attempt": 1, "memberUuid": "-"}


def plan(splits: int = 1):
    """FakeSource's ROWS rows over ``splits`` splits, into Blackhole."""
    options = f"row.num = {ROWS}, split.num = {splits}"  # row.num is per reader (one)
    return plan_job(f"source {{ FakeSource {{ {options} }} }}\nsink {{ Blackhole {{}} }}")


def fake(splits: int = 1) -> FakeSource:
    node = plan(splits).pipelines[0].source
    return FakeSource(node.config, node.path)


def rates(started: tuple[float, float]) -> tuple[float, float]:
    """ROWS over the wall-clock and over this thread's CPU time since ``started`` (both read
    by ``clocks``): the CPU rate does not count time other processes took from the thread."""
    wall, cpu = clocks()
    return ROWS / (wall - started[0]), ROWS / (cpu - started[1])


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def lane_b(source: FakeSource) -> tuple[float, float]:
    """Today's reader data plane itself (``run_reader``), as a Lane B task group runs it: its
    splits one after another. Rows/s by wall-clock and by CPU time."""
    splits = source.create_splits("BATCH")
    assignments = [{"splitId": s["splitId"], "split": s, "offset": 0} for s in splits]
    started = clocks()
    counters = run_reader(
        plan(len(splits)).pipelines[0].to_json(),
        assignments,
        "BATCH",
        {**CONTEXT, "checkpointing": False},
        threading.Event(),
        lambda counters, positions: None,
        lambda split_id, offset: None,
    )
    assert counters.received == ROWS, counters.received
    return rates(started)


_sequence = iter(range(10**9))


def envelope(attempt: int, kind: CommandKind, payload: dict | None = None):
    n = next(_sequence)
    return SourceCommandEnvelope.build(
        job_id=1,
        source_runtime_id="1/1",
        epoch=1,
        sender_attempt=1,
        target_attempt=attempt,
        sequence=n,
        command_id=f"c{n}",
        kind=kind,
        payload=json.dumps(payload).encode() if payload is not None else b"",
    )


def lane_a(
    source: FakeSource, checkpoints: list[float] | None = None, every: int | None = None
) -> tuple[float, float]:
    """The reader event loop, driven as a Lane A reader task group drives it: a step, then
    that step's records through the same chain as its flush hands them on, the metrics clock
    looked at; a checkpoint barrier every ``every`` steps (the time from each to its snapshot
    in ``checkpoints``). Rows/s by wall-clock and by CPU time."""
    mailbox = ReaderMailbox(1, "1/1", 1, MailboxLimits.from_settings(), WorkerBudget(10**9))
    reader = ManagedFakeReader(source)
    barriers: dict[int, float] = {}
    parts: list = []

    def on_snapshot(snapshot):
        if checkpoints is not None:
            checkpoints.append(time.perf_counter() - barriers[snapshot.checkpoint])

    loop = ReaderEventLoop(
        mailbox, reader, PollLimits.from_settings(), parts.append, on_snapshot, CAPABILITY.digest
    )
    loop.start()
    mailbox.admit(envelope(1, CommandKind.ASSIGN_SPLITS, {"splits": source.create_splits("BATCH")}))
    mailbox.admit(envelope(1, CommandKind.NO_MORE_SPLITS))
    wake, counters, steps, checkpoint = threading.Event(), Counters(), 0, 0
    started = clocks()
    pipeline = plan(source.config["split.num"]).pipelines[0]
    _, chain = compile_chain(pipeline.to_json(), {**CONTEXT, "checkpointing": False})
    key, last_report = pipeline.source.key, time.monotonic()
    schema = source.output_schema()
    arrow = arrow_schema(schema)
    max_rows, max_bytes = batch_limits()
    while loop.life.state != Life.CLOSED:
        wake.clear()
        loop.step()
        if parts:  # the step's records, as its task group's flush hands them on
            for batch in step_batches(parts, schema, arrow):
                for part, size in sized_parts(batch, max_rows, max_bytes):
                    written, written_bytes = chain.deliver(key, part, size)
                    counters.add(part.num_rows, written, size, written_bytes)
            parts.clear()
        now = time.monotonic()
        if now - last_report >= METRICS_INTERVAL:
            last_report = now
            counters.roll()
        steps += 1
        if every is not None and steps % every == 0:
            checkpoint += 1
            barriers[checkpoint] = time.perf_counter()
            mailbox.admit(envelope(1, CommandKind.CHECKPOINT, {"checkpoint": checkpoint}))
    assert counters.received == ROWS, counters.received
    return rates(started)


def admission() -> tuple[list[float], int, int]:
    """Latency of admit() while the loop drains, and the peak queued bytes against the bound
    with a producer that outruns the loop."""
    limits = MailboxLimits.from_settings()
    mailbox = ReaderMailbox(1, "1/1", 1, limits, WorkerBudget(10**9))
    reader = ManagedFakeReader(fake())
    loop = ReaderEventLoop(
        mailbox, reader, PollLimits.from_settings(), lambda r: None, lambda s: None, "d"
    )
    loop.start()
    latencies, peak = [], 0
    payload = {"splits": [{"splitId": "x" * 400, "index": 0}]}
    for n in range(20_000):
        env = envelope(1, CommandKind.ASSIGN_SPLITS, payload)
        started = time.perf_counter()
        mailbox.admit(env)
        latencies.append(time.perf_counter() - started)
        peak = max(peak, mailbox.bytes)
        if n % 3 == 0:  # the loop takes one command for every three offered
            loop.step()
    return latencies, peak, limits.max_bytes


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def steady(splits: int, every: int | None) -> tuple[float, float, list[float], list[float]]:
    """Both lanes over the same rows, ROUNDS rounds of a pair each (the pair's order swapped
    every other round): the median rows/s of each lane and the rounds' ratios, sorted, by
    wall-clock and by CPU time."""
    source = fake(splits)
    lane_a(source, every=every), lane_b(source)  # warm
    a_runs, b_runs = [], []
    for round_ in range(ROUNDS):
        if round_ % 2:
            b_runs.append(lane_b(source))
            a_runs.append(lane_a(source, every=every))
        else:
            a_runs.append(lane_a(source, every=every))
            b_runs.append(lane_b(source))
    pairs = list(zip(a_runs, b_runs, strict=True))
    return (
        statistics.median(a[0] for a in a_runs),
        statistics.median(b[0] for b in b_runs),
        sorted(a[0] / b[0] for a, b in pairs),
        sorted(a[1] / b[1] for a, b in pairs),
    )


def main() -> None:
    tune_for_rows()  # both lanes under the worker process's GC settings, as in a task group
    print(
        f"steady state, {ROWS:,} FakeSource rows into Blackhole, {ROUNDS} rounds of both lanes "
        f"side by side (Lane B: its data plane, batches of {batch_limits()[0]:,}; Lane A: the "
        "event loop's poll turns); the ratio Lane A / Lane B is the median of the rounds' ratios "
        "(goal >= 0.97), by wall-clock and by the thread's CPU time:"
    )
    for label, splits, every in CASES:
        a, b, ratios, cpu = steady(splits, every)
        print(
            f"  {label + ':':<38} Lane A {a:>11,.0f} rows/s, Lane B {b:>11,.0f} rows/s, ratio "
            f"{statistics.median(ratios):.3f} (rounds {ratios[0]:.3f} .. {ratios[-1]:.3f}), "
            f"by CPU time {statistics.median(cpu):.3f} (rounds {cpu[0]:.3f} .. {cpu[-1]:.3f})"
        )
    source = fake()
    checkpoints: list[float] = []
    for _ in range(5):
        lane_a(source, checkpoints, every=CHECKPOINT_EVERY)
    snapshot_b = []
    reader = ManagedFakeReader(source)
    for _ in range(200):
        started = time.perf_counter()
        reader.snapshot()
        snapshot_b.append(time.perf_counter() - started)
    print(
        f"checkpoint, barrier admitted to snapshot taken: Lane A p99 "
        f"{percentile(checkpoints, 0.99) * 1000:.3f} ms ({len(checkpoints)} checkpoints); "
        f"Lane B snapshot between batches p99 {percentile(snapshot_b, 0.99) * 1000:.3f} ms"
    )
    latencies, peak, bound = admission()
    print(
        f"admission: p50 {percentile(latencies, 0.5) * 1e6:.1f} us, p99 "
        f"{percentile(latencies, 0.99) * 1e6:.1f} us over {len(latencies):,} commands "
        f"(goal p99 <= 5 ms); peak mailbox bytes {peak:,} of a {bound:,} bound"
    )


if __name__ == "__main__":
    main()
