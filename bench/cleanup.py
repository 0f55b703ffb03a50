"""Terminal-state cleanup at scale: 10,000 finished jobs whose cleanup records fall due at the
same moment, on a live cluster of 2 masters and 2 workers. Measured: the time from that moment
until every record is DONE (the active master's sweep claims them, the workers' control pools
execute them, each record in its own transaction), the rate, and beside it one PostgreSQL
commit on the same server in the same run (what a record costs, in commits).

The jobs are one finished job cloned with set-based SQL (pipelines, task groups, split
assignments, history with its summary), each with a JOB_STATE record due a few seconds ahead.
"""

from __future__ import annotations

import statistics
import time

import psycopg

from tests.clusterkit import Cluster, DatabaseTemplate, wait_for

JOBS = 10_000
LEAD = 5.0  # seconds between the end of the setup and the moment every record is due
JOB = """
env { job.mode = BATCH, parallelism = 2 }
source { FakeSource { row.num = 10, split.num = 2 } }
sink { Blackhole { } }
"""


def clone_finished(conn: psycopg.Connection, template: int, count: int) -> None:
    cols = [
        r[0]
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'engine_job'"
            " AND column_name <> 'id' ORDER BY ordinal_position"
        )
    ]
    listed = ", ".join(f'"{c}"' for c in cols)
    selected = ", ".join(f'j."{c}"' for c in cols)
    first = conn.execute("SELECT max(id) + 1 FROM engine_job").fetchone()[0]
    conn.execute(
        f"INSERT INTO engine_job ({listed}) SELECT {selected}"
        " FROM engine_job j, generate_series(1, %s) WHERE j.id = %s",
        (count, template),
    )
    conn.execute(
        'INSERT INTO engine_pipeline (job_id, "index", status, restore_count, plan,'
        " splits_assigned, checkpoints_completed, checkpoints_failed, error_msg)"
        " SELECT j.id, p.\"index\", p.status, 0, p.plan, true, 0, 0, ''"
        " FROM engine_pipeline p, engine_job j WHERE p.job_id = %s AND j.id >= %s",
        (template, first),
    )
    conn.execute(
        'INSERT INTO engine_taskgroup (job_id, pipeline_id, kind, "index", status, attempt,'
        " error_msg, source_received, sink_written, rows_per_second, busy_seconds,"
        " cpu_seconds, updated_at)"
        " SELECT np.job_id, np.id, t.kind, t.\"index\", 'FINISHED', 1, '', 10, 10, 0, 0, 0, now()"
        " FROM engine_taskgroup t JOIN engine_pipeline tp ON tp.id = t.pipeline_id"
        ' JOIN engine_pipeline np ON np."index" = tp."index" AND np.job_id >= %s'
        " WHERE t.job_id = %s",
        (first, template),
    )
    conn.execute(
        "INSERT INTO engine_splitassignment (pipeline_id, split_id, split, reader_index,"
        " \"offset\", done) SELECT p.id, 'split-' || g, '{}'::jsonb, 0, 5, true"
        " FROM engine_pipeline p, generate_series(1, 2) g WHERE p.job_id >= %s",
        (first,),
    )
    conn.execute(
        "INSERT INTO history_jobhistory (job_id, status, finished_at, episodes, summary,"
        " error_msg) SELECT j.id, 'FINISHED', now(), '[]'::jsonb, h.summary, ''"
        " FROM engine_job j, history_jobhistory h WHERE h.job_id = %s AND j.id >= %s",
        (template, first),
    )
    conn.execute(
        "INSERT INTO engine_jobcleanuprecord (job_id, job_name, kind, state, due_at, created_at,"
        " attempts, executions, last_error)"
        " SELECT id, name, 'JOB_STATE', 'PENDING', now() + make_interval(secs => %s), now(),"
        " 0, 0, '' FROM engine_job WHERE id >= %s",
        (LEAD + 3600, first),  # pushed out of reach until the setup is complete
    )


def one_commit(conn: psycopg.Connection, samples: int = 200) -> float:
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS bench_commit (n int)")
    times = []
    for n in range(samples):
        t0 = time.perf_counter()
        with conn.transaction():
            conn.execute("INSERT INTO bench_commit VALUES (%s)", (n,))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    template = DatabaseTemplate()
    cluster = Cluster(template, masters=2, workers=2, slots=4)
    cluster.env["KEEL_JOB_STATE_CLEANUP_DELAY"] = "1h"
    try:
        cluster.up()
        from tests.test_jobs_cluster import submit, wait_status

        job_id = submit(cluster, JOB)
        assert wait_status(cluster, job_id, {"FINISHED", "FAILED"}, 60)["jobStatus"] == "FINISHED"
        with psycopg.connect(cluster.database_url, autocommit=True) as conn:
            t0 = time.perf_counter()
            clone_finished(conn, job_id, JOBS - 1)
            conn.execute(
                "UPDATE engine_jobcleanuprecord SET due_at = now() + make_interval(secs => %s)",
                (LEAD,),
            )
            due = conn.execute("SELECT max(due_at) FROM engine_jobcleanuprecord").fetchone()[0]
            print(f"setup: {JOBS:,} finished jobs in {time.perf_counter() - t0:.1f} s")
            commit = one_commit(conn)

            def done() -> int:
                return conn.execute(
                    "SELECT count(*) FROM engine_jobcleanuprecord WHERE state = 'DONE'"
                ).fetchone()[0]

            wait_for(lambda: done() == JOBS, 900, interval=0.2, what="every record DONE")
            last = conn.execute("SELECT max(executed_at) FROM engine_jobcleanuprecord").fetchone()[
                0
            ]
            twice = conn.execute(
                "SELECT count(*) FROM engine_jobcleanuprecord"
                " WHERE kind = 'JOB_STATE' AND executions <> 1"
            ).fetchone()[0]
            left = conn.execute("SELECT count(*) FROM engine_taskgroup").fetchone()[0]
    finally:
        cluster.down()
        template.drop_all()
    elapsed = (last - due).total_seconds()
    per_record = elapsed / JOBS
    print(f"{JOBS:,} records due at one moment: all DONE {elapsed:.1f} s after it")
    print(f"rate: {JOBS / elapsed:,.0f} records/s; {per_record * 1000:.2f} ms per record")
    print(f"one PostgreSQL commit (median of 200): {commit * 1000:.3f} ms")
    print(f"ratio per-record cleanup / one commit: {per_record / commit:.1f}")
    print(f"records executed other than once: {twice}; task groups left: {left}")
