"""Lane A beside Lane B on real clusters: the same BATCH FakeSource -> Blackhole job on a
cluster whose allow-list puts FakeSource in Lane A and on one that leaves it in Lane B (the
default), in alternating rounds of the same run.

The figure is the reader's rows divided by the time its data plane ran (its runtime thread
measures it, in a worker process with the whole engine around it), by wall-clock and by the
thread's CPU time; the ratio Lane A / Lane B is the design's steady-state gate (>= 0.97). Lane
A's time includes waiting for its assignments and for no-more-splits, which cross the broker.
"""

from __future__ import annotations

import json
import statistics
import urllib.request

from tests.clusterkit import Cluster, DatabaseTemplate, wait_for

ROWS = 3_000_000
ROUNDS = 3
CONFIG = f"""
env {{ job.mode = BATCH, parallelism = 1 }}
source {{ FakeSource {{ row.num = {ROWS}, split.num = 1 }} }}
sink {{ Blackhole {{ }} }}
"""


def run(cluster: Cluster, lane: str) -> tuple[float, float]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.port}/api/v1/jobs",
        method="POST",
        data=json.dumps({"config": CONFIG}).encode(),
        headers={"Authorization": f"Token {cluster.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        job_id = json.loads(resp.read())["jobId"]
    wait_for(
        lambda: cluster.one(
            "SELECT status IN ('FINISHED', 'FAILED') FROM engine_job WHERE id = %s", (job_id,)
        ),
        300,
        interval=0.2,
        what=f"the Lane {lane} job to end",
    )
    assert cluster.one("SELECT status FROM engine_job WHERE id = %s", (job_id,)) == "FINISHED"
    recorded = cluster.one(
        "SELECT plan::jsonb->'sourceRuntime'->>'lane' FROM engine_pipeline WHERE job_id = %s",
        (job_id,),
    )
    assert recorded == lane, f"planned in Lane {recorded}, expected {lane}"
    rows, busy, cpu = cluster.db.execute(
        "SELECT source_received, busy_seconds, cpu_seconds FROM engine_taskgroup "
        "WHERE job_id = %s AND kind = 'READER'",
        (job_id,),
    ).fetchone()
    assert rows == ROWS
    return rows / busy, rows / cpu


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
