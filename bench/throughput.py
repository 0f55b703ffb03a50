"""Data-plane throughput: FakeSource -> Blackhole rows/s per slot on a real cluster, beside a bare
Python loop that generates the same rows and consumes them in one process: the row model's cost
without an engine around it. The data plane carries Arrow batches, so the goal is a ratio of at
least 10.

The engine figure is one reader's rows divided by the time its data plane ran (measured by the
reader's runtime thread in a worker process, with the whole engine around it: heartbeats, Celery
consumer, metrics reports to PostgreSQL). Runs alternate and medians are compared, both by
wall-clock time and by the thread's CPU time (this 2-core machine is noisy; CPU time is not).
"""

from __future__ import annotations

import statistics
import time

from tests.clusterkit import Cluster, DatabaseTemplate, reader_rates, run_batch_job

ROWS = 6_000_000
BATCH = 4096
ROUNDS = 3
CONFIG = f"""
env {{ job.mode = BATCH, parallelism = 1 }}
source {{ FakeSource {{ row.num = {ROWS}, split.num = 1 }} }}
sink {{ Blackhole {{ }} }}
"""


def bare_loop() -> tuple[float, float]:
    """The same rows (id, name, value), generated in batches and counted: no engine at all.

    Returns (rows per wall-clock second, rows per CPU second of this thread).
    """
    started, cpu_started = time.perf_counter(), time.thread_time()
    count = 0
    for start in range(0, ROWS, BATCH):
        rows = [(i, f"name-{i}", i * 0.5) for i in range(start, min(start + BATCH, ROWS))]
        count += len(rows)
    return (count / (time.perf_counter() - started), count / (time.thread_time() - cpu_started))


def engine_run(cluster: Cluster) -> tuple[float, float]:
    """One batch job on the cluster: (rows per wall second, rows per CPU second) of its reader,
    as the reader's runtime thread measured them around its data plane."""
    job_id = run_batch_job(cluster, CONFIG, "the throughput job")
    return reader_rates(cluster, job_id, ROWS)


def main() -> None:
    template = DatabaseTemplate()
    cluster = Cluster(template, masters=1, workers=1, slots=2)
    engine, bare = [], []
    try:
        cluster.up()
        for _ in range(ROUNDS):
            engine.append(engine_run(cluster))
            bare.append(bare_loop())
    finally:
        cluster.down()
        template.drop_all()
    for index, label in ((0, "wall-clock"), (1, "CPU-time")):
        e = statistics.median(r[index] for r in engine)
        b = statistics.median(r[index] for r in bare)
        print(
            f"{label}: engine FakeSource -> Blackhole per slot {e:,.0f} rows/s; "
            f"bare loop {b:,.0f} rows/s; ratio {e / b:.2f} (goal >= 10)"
        )
    print(
        "runs (engine wall, bare wall): "
        + "; ".join(f"{e[0]:,.0f} / {b[0]:,.0f}" for e, b in zip(engine, bare, strict=True))
    )


if __name__ == "__main__":
    main()
