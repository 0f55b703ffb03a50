"""Lane A beside Lane B on real clusters: the same BATCH FakeSource -> Blackhole job on a
cluster whose allow-list puts FakeSource in Lane A and on one that leaves it in Lane B (the
default), in alternating rounds of the same run.

The figure is the reader's rows divided by the time its data plane ran (its runtime thread
measures it, in a worker process with the whole engine around it), by wall-clock and by the
thread's CPU time; the ratio Lane A / Lane B is the design's steady-state gate (>= 0.97). Lane
A's time includes waiting for its assignments and for no-more-splits, which cross the broker.
"""

from __future__ import annotations

import statistics

from tests.clusterkit import Cluster, DatabaseTemplate, reader_rates, run_batch_job

ROWS = 3_000_000
ROUNDS = 3
CONFIG = f"""
env {{ job.mode = BATCH, parallelism = 1 }}
source {{ FakeSource {{ row.num = {ROWS}, split.num = 1 }} }}
sink {{ Blackhole {{ }} }}
"""


def run(cluster: Cluster, lane: str) -> tuple[float, float]:
    job_id = run_batch_job(cluster, CONFIG, f"the Lane {lane} job")
    recorded = cluster.one(
        "SELECT plan::jsonb->'sourceRuntime'->>'lane' FROM engine_pipeline WHERE job_id = %s",
        (job_id,),
    )
    assert recorded == lane, f"planned in Lane {recorded}, expected {lane}"
    return reader_rates(cluster, job_id, ROWS)


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
    print(f"on clusters, {ROWS:,} FakeSource rows -> Blackhole, median of {ROUNDS} rounds:")
    for index, label in ((0, "wall-clock"), (1, "CPU-time")):
        a = statistics.median(r[index] for r in a_runs)
        b = statistics.median(r[index] for r in b_runs)
        print(
            f"  {label}: Lane A {a:,.0f} rows/s; Lane B {b:,.0f} rows/s; "
            f"ratio {a / b:.3f} (goal >= 0.97)"
        )
    print(
        "  runs (Lane A wall / Lane B wall): "
        + "; ".join(f"{a[0]:,.0f} / {b[0]:,.0f}" for a, b in zip(a_runs, b_runs, strict=True))
    )


if __name__ == "__main__":
    main()
