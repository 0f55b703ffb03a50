"""Lane A beside Lane B on real clusters: the same BATCH FakeSource -> Blackhole job on a
cluster whose allow-list puts FakeSource in Lane A and on one that leaves it in Lane B (the
default), in alternating rounds of the same run.

- Steady state (the design's gate, >= 0.97): the reader's rows between two of its metrics
  reports (one a second, stamped by PostgreSQL as they land) over the time between them, for
  every such window but the first and the last (start-up and end); the median of all of a
  lane's windows (the machine is noisy: a window's rate can dip by a third, in either lane).
- Whole job: the reader's rows divided by the time its data plane ran (its runtime thread
  measures it, in a worker process with the whole engine around it), by wall-clock and by the
  thread's CPU time. Lane A's includes waiting for its assignments and for no-more-splits,
  which cross the broker, and its close.
"""

from __future__ import annotations

import itertools
import statistics
import time

from tests.clusterkit import Cluster, DatabaseTemplate, reader_rates

ROWS = 30_000_000
ROUNDS = 3
CONFIG = f"""
env {{ job.mode = BATCH, parallelism = 1 }}
source {{ FakeSource {{ row.num = {ROWS}, split.num = 1 }} }}
sink {{ Blackhole {{ }} }}
"""
#: Windows between the reader's reports, the first and the last left out: at least this many.
STEADY_WINDOWS = 2


def reports_until_finished(cluster: Cluster, job_id: int, timeout: float = 300) -> list:
    """Every metrics report of the job's reader as (rows, PostgreSQL's time of the report),
    until the job has ended (FINISHED asserted)."""
    seen: list[tuple[int, float]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = cluster.one(
            "SELECT json_build_array(t.source_received, extract(epoch FROM t.updated_at), "
            "j.status) FROM engine_taskgroup t JOIN engine_job j ON j.id = t.job_id "
            "WHERE t.job_id = %s AND t.kind = 'READER'",
            (job_id,),
        )
        if row is not None:
            rows, at, status = row
            if rows and (not seen or seen[-1][0] != rows):
                seen.append((rows, float(at)))
            if status in ("FINISHED", "FAILED", "CANCELED"):
                assert status == "FINISHED", status
                return seen
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end within {timeout} s")


def steady_rates(reports: list[tuple[int, float]]) -> list[float]:
    """Rows per second in each window between two reports, but the first and the last."""
    windows = [(r1 - r0) / (t1 - t0) for (r0, t0), (r1, t1) in itertools.pairwise(reports)]
    assert len(windows) >= STEADY_WINDOWS + 2, f"too few reports for a steady state: {reports}"
    return windows[1:-1]


def run(cluster: Cluster, lane: str) -> tuple[list[float], float, float]:
    """(steady-state windows' rows/s, whole-job rows/s by wall-clock, by CPU time)."""
    code, body = cluster.post("/api/v1/jobs", {"config": CONFIG})
    assert code == 201, body
    job_id = body["jobId"]
    reports = reports_until_finished(cluster, job_id)
    recorded = cluster.one(
        "SELECT plan::jsonb->'sourceRuntime'->>'lane' FROM engine_pipeline WHERE job_id = %s",
        (job_id,),
    )
    assert recorded == lane, f"planned in Lane {recorded}, expected {lane}"
    return (steady_rates(reports), *reader_rates(cluster, job_id, ROWS))


def main() -> None:
    template = DatabaseTemplate()
    managed = Cluster(template, masters=1, workers=1, slots=2)
    managed.env["KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS"] = "FakeSource"
    legacy = Cluster(template, masters=1, workers=1, slots=2)
    a_runs, b_runs = [], []
    try:
        managed.up()
        legacy.up()
        run(managed, "A"), run(legacy, "B")  # warm
        for _ in range(ROUNDS):
            a_runs.append(run(managed, "A"))
            b_runs.append(run(legacy, "B"))
    finally:
        managed.down()
        legacy.down()
        template.drop_all()
    print(f"on clusters, {ROWS:,} FakeSource rows -> Blackhole, {ROUNDS} alternating rounds:")
    a_windows = [w for run_ in a_runs for w in run_[0]]
    b_windows = [w for run_ in b_runs for w in run_[0]]
    a, b = statistics.median(a_windows), statistics.median(b_windows)
    print(
        f"  steady state, median of {len(a_windows)} / {len(b_windows)} one-second windows: "
        f"Lane A {a:,.0f} rows/s; Lane B {b:,.0f} rows/s; ratio {a / b:.3f} (goal >= 0.97)"
    )
    for lane, windows in (("A", a_windows), ("B", b_windows)):
        q1, _, q3 = statistics.quantiles(windows, n=4)
        print(f"    Lane {lane} windows: quartiles {q1:,.0f} .. {q3:,.0f} rows/s")
    for index, label in ((1, "wall-clock"), (2, "CPU time")):
        a = statistics.median(r[index] for r in a_runs)
        b = statistics.median(r[index] for r in b_runs)
        print(
            f"  whole job by {label} (start-up and end included), median of {ROUNDS}: "
            f"Lane A {a:,.0f} rows/s; Lane B {b:,.0f} rows/s; ratio {a / b:.3f}"
        )


if __name__ == "__main__":
    main()
