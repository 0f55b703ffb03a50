"""Lane A beside Lane B on real clusters, at parallelism 1, 16 and 128: the same checkpointed
STREAMING FakeSource -> Blackhole job (endless splits, four a reader, as fast as they go) on a
cluster whose allow-list puts FakeSource in Lane A and on one that leaves it in Lane B (the
default), in alternating rounds of the same run (the lane that goes first alternates too). Each
run reads for a fixed time once every reader is reading, then is cancelled. Both clusters run on
a PostgreSQL server of the benchmark's own (every task group holds a session: 129 are more than
a default server allows); 128 readers on a 2-core machine share two worker processes.

For each lane and parallelism:

- steady-state rows/s: the job's rows in one-second windows while every reader was reading
  (from the last reader's second report until the run was cancelled), each reader's rows
  interpolated between its reports (PostgreSQL stamps them as they land); the median window
  of all rounds (goal: Lane A at least 0.97 of Lane B);
- CPU seconds per million rows: the worker processes' CPU time (/proc/<pid>/stat) over the same
  span, over the rows read in it (goal: at most +5%);
- worker RSS: the worker processes' VmRSS summed, peak and median while the job runs (goal: at
  most +5%);
- checkpoint p99: trigger to completion of the job's completed checkpoints, from the records
  the master writes as each ends (goal: at most max(+5%, +100 ms));
- Lane A only: control latency (a barrier admitted into a reader's mailbox until its event loop
  applies it; the readers' ``controlLatencyMs``) and admission through the broker (an
  enumerator's publish until the reader's handler admitted the command; the enumerator's
  ``publishToAdmissionMs``, goal p99 at most 5 ms), their histograms merged over readers and rounds.

``--schema rows`` adds a tinyint column: FakeSource's Lane B reader then builds rows as Lane A's
does, instead of Arrow columns, which separates the runtime's cost from the data plane's.

``./run bench source_runtime_cluster [--parallelism 1,16,128] [--seconds S] [--rounds N]
[--schema columns|rows]``; every figure is printed with whether its goal is met, and the exit
status is 0 either way.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from dataclasses import dataclass, field

from bench._cluster_samples import (
    JobWatch,
    SteadyFigures,
    checkpoint_seconds,
    goal,
    latency_summary,
    mib,
    percentile,
    ratio_line,
    runtime_reports,
    steady_figures,
    worker_pids,
)
from tests.clusterkit import Cluster, DatabaseTemplate
from tests.faultkit import PrivatePostgres

PARALLELISM = os.environ.get("KEEL_BENCH_SOURCE_PARALLELISM", "1,16,128")
STEADY_SECONDS = float(os.environ.get("KEEL_BENCH_SOURCE_SECONDS", "15"))
ROUNDS = int(os.environ.get("KEEL_BENCH_SOURCE_ROUNDS", "2"))
CHECKPOINT_MS = 1000
#: Splits per reader: the enumerator sends a command for each (admission latency samples).
SPLITS_PER_READER = 4
#: Deploying 128 task groups on a loaded 2-core machine takes a while.
START_TIMEOUT = 600
CANCEL_TIMEOUT = 600
#: A worker whose heartbeat thread waits long for the GIL (128 busy readers on 2 cores) is not
#: a lost member: what is measured here is the lanes, not failure detection.
HEARTBEAT = 30.0
SCHEMAS = {
    "columns": "",  # FakeSource's default: id bigint, name string, value double
    "rows": ", schema { fields { id = bigint, name = string, value = double, flag = tinyint } }",
}
CONFIG = """
env {{ job.mode = STREAMING, parallelism = {parallelism}, checkpoint.interval = {checkpoint} }}
source {{ FakeSource {{ endless = true, split.num = {splits} {schema} }} }}
sink {{ Blackhole {{ }} }}
"""


@dataclass
class LaneFigures:
    """One lane's runs at one parallelism."""

    steady: list[SteadyFigures] = field(default_factory=list)
    checkpoints: list[float] = field(default_factory=list)
    failed_checkpoints: int = 0
    control: list[dict] = field(default_factory=list)
    admission: list[dict] = field(default_factory=list)
    unsteady: int = 0  # runs whose readers never all read at once
    #: Runs that went wrong (a job that failed, or did not end once cancelled): the lane's
    #: cluster takes no further run.
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return median([w for s in self.steady for w in s.windows])

    @property
    def cpu(self) -> float:
        return median([s.cpu_per_mrows for s in self.steady])

    @property
    def rss_peak(self) -> float:
        return max((s.rss_peak for s in self.steady), default=math.nan)

    @property
    def rss_median(self) -> float:
        return median([s.rss_median for s in self.steady])


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def cluster_shape(parallelism: int) -> tuple[int, int]:
    """(workers, fixed slots each): an enumerator and the readers, in few processes."""
    workers = 1 if parallelism == 1 else 2
    return workers, -(-(parallelism + 1) // workers)


def run(cluster: Cluster, lane: str, p: int, seconds: float, schema: str, into: LaneFigures):
    """One job, read for ``seconds`` once every reader reads, then cancelled."""
    config = CONFIG.format(
        parallelism=p, checkpoint=CHECKPOINT_MS, splits=SPLITS_PER_READER * p, schema=schema
    )
    started = time.time()
    code, body = cluster.post("/api/v1/jobs", {"config": config})
    assert code == 201, body
    job_id = body["jobId"]
    watch = JobWatch(cluster, job_id, worker_pids(cluster))
    watch.until(lambda: watch.steady_for(p) >= seconds, START_TIMEOUT + seconds, "steady state")
    until = time.time()
    code, body = cluster.post(f"/api/v1/jobs/{job_id}/cancel")
    assert code == 202, body
    try:
        assert watch.until_ended(CANCEL_TIMEOUT) == "CANCELED", (job_id, watch.status)
    except AssertionError as exc:
        groups = cluster.query(
            "SELECT kind, status, count(*) FROM engine_taskgroup WHERE job_id = %s "
            "GROUP BY kind, status ORDER BY kind, status",
            (job_id,),
        )
        raise AssertionError(f"{exc} after its cancel; task groups {groups}") from exc
    recorded = cluster.one(
        "SELECT plan::jsonb->'sourceRuntime'->>'lane' FROM engine_pipeline WHERE job_id = %s",
        (job_id,),
    )
    assert recorded == lane, f"planned in Lane {recorded}, expected {lane}"
    steady = steady_figures(watch, started, until)
    if steady is None:
        into.unsteady += 1
    else:
        into.steady.append(steady)
    completed, failed = checkpoint_seconds(cluster, job_id)
    into.checkpoints += completed
    into.failed_checkpoints += failed
    into.control += runtime_reports(cluster, job_id, "READER", "controlLatencyMs")
    into.admission += runtime_reports(cluster, job_id, "ENUMERATOR", "publishToAdmissionMs")


def measure(template: DatabaseTemplate, p: int, seconds: float, rounds: int, schema: str):
    workers, slots = cluster_shape(p)
    managed = Cluster(
        template, masters=1, workers=workers, slots=slots, heartbeat_timeout=HEARTBEAT
    )
    managed.env["KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS"] = "FakeSource"
    legacy = Cluster(template, masters=1, workers=workers, slots=slots, heartbeat_timeout=HEARTBEAT)
    lanes = {"A": (managed, LaneFigures()), "B": (legacy, LaneFigures())}
    try:
        managed.up()
        legacy.up()
        warm = [(lane, 3.0, LaneFigures()) for lane in lanes]
        measured = [
            (lane, seconds, lanes[lane][1])
            for round_ in range(rounds)
            for lane in (("A", "B") if round_ % 2 == 0 else ("B", "A"))
        ]
        for lane, steady, into in warm + measured:
            cluster, figures = lanes[lane]
            if figures.errors:
                continue
            try:
                run(cluster, lane, p, steady, schema, into)
            except AssertionError as exc:
                figures.errors.append(str(exc))
    finally:
        managed.down()
        legacy.down()
    return lanes["A"][1], lanes["B"][1]


def report(p: int, a: LaneFigures, b: LaneFigures) -> None:
    for lane, figures in (("A", a), ("B", b)):
        for error in figures.errors:
            print(f"  Lane {lane}: a run went wrong, its cluster took no more: {error}")
    windows = sum(len(s.windows) for s in a.steady), sum(len(s.windows) for s in b.steady)
    print(
        f"  steady state: {windows[0]} / {windows[1]} one-second windows (runs without one: "
        f"A {a.unsteady}, B {b.unsteady})"
    )
    lines = (
        ("steady-state rows/s (>= 0.97)", a.rate, b.rate, "{:,.0f}", a.rate >= 0.97 * b.rate),
        ("CPU s per M rows (<= +5%)", a.cpu, b.cpu, "{:.3f}", a.cpu <= 1.05 * b.cpu),
        (
            "worker RSS peak (<= +5%)",
            a.rss_peak,
            b.rss_peak,
            None,
            a.rss_peak <= 1.05 * b.rss_peak,
        ),
        (
            "worker RSS median (<= +5%)",
            a.rss_median,
            b.rss_median,
            None,
            a.rss_median <= 1.05 * b.rss_median,
        ),
    )
    for label, value_a, value_b, fmt, ok in lines:
        print(ratio_line(label, value_a, value_b, mib if fmt is None else fmt.format, ok))
    p99_a, p99_b = percentile(a.checkpoints, 0.99), percentile(b.checkpoints, 0.99)
    print(
        ratio_line(
            "checkpoint p99 (<= max(+5%, +100 ms))",
            p99_a * 1000,
            p99_b * 1000,
            "{:,.1f} ms".format,
            p99_a <= max(p99_b * 1.05, p99_b + 0.100),
        )
        + f"  ({len(a.checkpoints)} / {len(b.checkpoints)} completed, "
        f"{a.failed_checkpoints} / {b.failed_checkpoints} not)"
    )
    count, p50, p99, largest = latency_summary(a.control)
    print(
        f"  Lane A control latency, barrier admitted -> applied: p50 {p50:.3f} ms, p99 "
        f"{p99:.3f} ms, max {largest:.3f} ms over {count} barriers (no goal set)"
    )
    count, p50, p99, largest = latency_summary(a.admission)
    print(
        f"  Lane A admission through the broker, publish -> admitted: p50 {p50:.3f} ms, p99 "
        f"{p99:.3f} ms, max {largest:.3f} ms over {count} commands (goal p99 <= 5 ms: "
        f"{goal(count > 0 and p99 <= 5.0)})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench source_runtime_cluster")
    parser.add_argument("--parallelism", default=PARALLELISM, help="comma-separated")
    parser.add_argument("--seconds", type=float, default=STEADY_SECONDS, help="steady, a run")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--schema", choices=sorted(SCHEMAS), default="columns")
    args = parser.parse_args(argv or [])
    with PrivatePostgres({"max_connections": 600}) as postgres:
        template = DatabaseTemplate(postgres.url)
        try:
            for p in (int(n) for n in args.parallelism.split(",")):
                started = time.monotonic()
                a, b = measure(template, p, args.seconds, args.rounds, SCHEMAS[args.schema])
                workers, slots = cluster_shape(p)
                print(
                    f"parallelism {p} ({workers} worker process(es) x {slots} slots), "
                    f"STREAMING FakeSource ({args.schema}) -> Blackhole, a checkpoint every "
                    f"{CHECKPOINT_MS} ms, {args.rounds} alternating rounds of "
                    f"{args.seconds:.0f} s steady (A = Lane A, B = Lane B):"
                )
                report(p, a, b)
                print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
        finally:
            template.drop_all()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
