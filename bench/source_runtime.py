"""The managed Source runtime beside today's readers, in one process and run.

- Steady-state throughput: FakeSource's rows read by Lane B's loop (``read`` in batches of the
  data plane's size) and by Lane A (the reader event loop driving FakeSource's managed reader,
  poll turns of ``engine.source-runtime.poll.max-records``), each lane pushing its rows into
  the same Blackhole chain as a reader task group does (Lane B per batch, Lane A per step),
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
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")
django.setup()

from engine.connectors.fake import FakeSource  # noqa: E402 - after django.setup()
from engine.connectors.fake_managed import CAPABILITY, ManagedFakeReader  # noqa: E402
from engine.jobs.planner import plan_job  # noqa: E402
from engine.member.dataplane import BATCH_SIZE, compile_chain  # noqa: E402
from engine.sourceruntime.choices import CommandKind  # noqa: E402
from engine.sourceruntime.envelope import SourceCommandEnvelope  # noqa: E402
from engine.sourceruntime.limits import MailboxLimits, PollLimits  # noqa: E402
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget  # noqa: E402
from engine.sourceruntime.reader import ReaderEventLoop  # noqa: E402

ROWS = 200_000
ROUNDS = 5


PLAN = plan_job(f"source {{ FakeSource {{ row.num = {ROWS} }} }}\nsink {{ Blackhole {{}} }}")


def fake() -> FakeSource:
    node = PLAN.pipelines[0].source
    return FakeSource(node.config, node.path)


def sink_chain():
    """The transforms-and-sinks chain a reader pushes its rows into (here: Blackhole), as the
    task group builds it: both lanes pay for the same pushes."""
    context = {"jobId": 1, "pipelineId": 0, "readerIndex": 0, "attempt": 1, "memberUuid": "-"}
    plan = PLAN.pipelines[0].to_json()
    return plan["source"]["key"], compile_chain(plan, {**context, "checkpointing": False})[1]


def lane_b(source: FakeSource) -> float:
    split = source.create_splits("BATCH")[0]
    key, chain = sink_chain()
    started, rows = time.perf_counter(), 0
    for batch, _ in source.read(split, 0, "BATCH", BATCH_SIZE):
        rows += len(batch)
        chain.push(key, batch)
    assert rows == ROWS
    return rows / (time.perf_counter() - started)


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


def lane_a(source: FakeSource, checkpoints: list[float] | None = None) -> float:
    mailbox = ReaderMailbox(1, "1/1", 1, MailboxLimits.from_settings(), WorkerBudget(10**9))
    reader = ManagedFakeReader(source)
    counted = [0]
    barriers: dict[int, float] = {}
    key, chain = sink_chain()
    step_rows: list = []

    def emit(records):
        counted[0] += len(records)
        step_rows.extend(records)  # pushed after the step, as the reader task group does

    def on_snapshot(snapshot):
        if checkpoints is not None:
            checkpoints.append(time.perf_counter() - barriers[snapshot.checkpoint])

    loop = ReaderEventLoop(
        mailbox, reader, PollLimits.from_settings(), emit, on_snapshot, CAPABILITY.digest
    )
    loop.start()
    mailbox.admit(envelope(1, CommandKind.ASSIGN_SPLITS, {"splits": source.create_splits("BATCH")}))
    mailbox.admit(envelope(1, CommandKind.NO_MORE_SPLITS))
    started, steps, checkpoint = time.perf_counter(), 0, 0
    while loop.step():
        if step_rows:
            chain.push(key, list(step_rows))
            step_rows.clear()
        steps += 1
        if checkpoints is not None and steps % 20 == 0:
            checkpoint += 1
            barriers[checkpoint] = time.perf_counter()
            mailbox.admit(envelope(1, CommandKind.CHECKPOINT, {"checkpoint": checkpoint}))
    assert counted[0] == ROWS, counted[0]
    return ROWS / (time.perf_counter() - started)


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


def main() -> None:
    source = fake()
    lane_a(source), lane_b(source)  # warm
    a_runs, b_runs = [], []
    for _ in range(ROUNDS):
        a_runs.append(lane_a(source))
        b_runs.append(lane_b(source))
    a, b = statistics.median(a_runs), statistics.median(b_runs)
    print(f"steady state, {ROWS:,} FakeSource rows, median of {ROUNDS} alternating rounds:")
    print(f"  Lane B (read in batches of {BATCH_SIZE:,}, pushed to Blackhole)  {b:>12,.0f} rows/s")
    print(f"  Lane A (event loop, poll turns)     {a:>12,.0f} rows/s")
    print(f"  ratio Lane A / Lane B: {a / b:.3f} (goal >= 0.97)")
    checkpoints: list[float] = []
    lane_a(source, checkpoints)
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
