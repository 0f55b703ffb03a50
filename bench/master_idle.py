"""The active master's idle cost as history grows: one pass of every active step (the master's
own step table, every timer due) with 10 running jobs, in a database with no finished job and
in one with 100,000 finished jobs (their pipelines, task groups, split assignments, history
records and 5 events each), measured side by side in the same run (goal: the ratio stays
within 1.5, i.e. flat).

The passes run in this process on real PostgreSQL (no engine processes), alternating blocks
between the two databases so both see the same load on this machine. The finished jobs are one
submitted job cloned with set-based SQL and marked FINISHED a minute ago (younger than every
retention age: the retention sweep finds nothing to delete, as in a steady state).
"""

from __future__ import annotations

import logging
import statistics
import sys
import time

from bench.member_loss import BenchError, columns, one, quoted, setup_django, sql, use_database
from tests.clusterkit import DatabaseTemplate

HISTORY = 100_000
RUNNING = 10
BLOCKS = 6
PASSES = 20  # per block
EPOCH = 7
GOAL = 1.5
SESSIONS: list = []  # the members' sessions (their locks), closed at the end

JOB = """
env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 0 }
source { FakeSource { split.num = 2, rows.per-second = 10, endless = true } }
sink { Blackhole { } }
"""


def clone_jobs(template: int, count: int, status: str) -> None:
    """``count`` copies of job ``template`` (pipelines, task groups), in ``status``."""
    from engine.models import Job, Pipeline, TaskGroup

    first = one("SELECT coalesce(max(id), 0) + 1 FROM engine_job")
    job_cols = columns(Job)
    sql(
        f"INSERT INTO engine_job ({quoted(job_cols, '')}) SELECT {quoted(job_cols, 'j.')}"
        " FROM engine_job j, generate_series(1, %s) WHERE j.id = %s",
        [count, template],
    )
    p_cols = columns(Pipeline, "job_id")
    sql(
        f"INSERT INTO engine_pipeline (job_id, {quoted(p_cols, '')})"
        f" SELECT j.id, {quoted(p_cols, 'p.')} FROM engine_pipeline p, engine_job j"
        " WHERE p.job_id = %s AND j.id >= %s",
        [template, first],
    )
    t_cols = columns(TaskGroup, "job_id", "pipeline_id")
    sql(
        f"INSERT INTO engine_taskgroup (job_id, pipeline_id, {quoted(t_cols, '')})"
        f" SELECT np.job_id, np.id, {quoted(t_cols, 't.')} FROM engine_taskgroup t"
        " JOIN engine_pipeline tp ON tp.id = t.pipeline_id JOIN engine_pipeline np"
        ' ON np."index" = tp."index" AND np.job_id >= %s WHERE t.job_id = %s',
        [first, template],
    )
    finished = status == "FINISHED"
    sql(
        "UPDATE engine_job SET status = %s, finished_at = CASE WHEN %s"
        " THEN now() - interval '1 minute' END WHERE id >= %s",
        [status, finished, first],
    )
    sql("UPDATE engine_pipeline SET status = %s WHERE job_id >= %s", [status, first])
    sql(
        "UPDATE engine_taskgroup SET status = %s, attempt = 1 WHERE job_id >= %s",
        ["FINISHED" if finished else "RUNNING", first],
    )
    if finished:
        sql(
            "INSERT INTO engine_splitassignment (pipeline_id, split_id, split, reader_index,"
            " \"offset\", done) SELECT p.id, 'split-' || g, '{}'::jsonb, 0, 10, true"
            " FROM engine_pipeline p, generate_series(1, 2) g WHERE p.job_id >= %s",
            [first],
        )
        sql(
            "INSERT INTO history_jobhistory (job_id, status, finished_at, episodes)"
            " SELECT id, 'FINISHED', finished_at, '[]'::jsonb FROM engine_job WHERE id >= %s",
            [first],
        )
        sql(
            "INSERT INTO engine_engineevent (at, kind, job_id, payload)"
            " SELECT now() - interval '1 minute', 'taskgroup.status', j.id, '{}'::jsonb"
            " FROM engine_job j, generate_series(1, 5) WHERE j.id >= %s",
            [first],
        )
        sql("DELETE FROM engine_dirtyjobstate WHERE job_id >= %s", [first])


def prepare(db_name: str, history: int) -> None:
    """A member with slots, RUNNING jobs on it, and ``history`` finished jobs."""
    use_database(db_name)
    from engine.cluster.membership import register_member
    from engine.jobs.submission import submit_job
    from engine.models import ClusterState, Job, MasterLease
    from engine.states import SlotMode

    MasterLease.objects.update_or_create(id=1, defaults={"epoch": EPOCH, "holder": "bench"})
    ClusterState.objects.get_or_create(id=1)
    template = submit_job(JOB).id
    if history:
        clone_jobs(template, history, "FINISHED")
    clone_jobs(template, RUNNING, "RUNNING")
    member = register_member(f"bench-{db_name}", 2 * RUNNING, SlotMode.FIXED)
    SESSIONS.append(member)
    sql("UPDATE engine_taskgroup SET member_id = %s WHERE status = 'RUNNING'", [member.id])
    Job.objects.filter(id=template).delete()
    sql("VACUUM ANALYZE")
    finished, running = sql(
        "SELECT count(*) FILTER (WHERE status = 'FINISHED'),"
        " count(*) FILTER (WHERE status = 'RUNNING') FROM engine_job"
    )[0]
    if (finished, running) != (history, RUNNING):
        raise BenchError(f"setup: {finished} finished and {running} running jobs")


def passes(db_name: str, count: int) -> list[float]:
    """``count`` passes of every active step of a master (every timer due), in seconds."""
    use_database(db_name)
    from engine.master.loop import Master, MasterOptions

    master = Master(MasterOptions(name="bench", heartbeat_timeout=3600))  # no heartbeats here
    steps = (master.sweep, *master.active_steps)
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        did = [step.run(EPOCH) for step in steps]
        samples.append(time.perf_counter() - t0)
        if any(did):
            raise BenchError(f"the master found work in an idle pass: {did}")
    return samples


def main() -> None:
    template = DatabaseTemplate()
    try:
        empty, full = template.clone(), template.clone()
        setup_django(empty)
        logging.disable(logging.WARNING)
        prepare(empty, 0)
        t0 = time.perf_counter()
        prepare(full, HISTORY)
        print(f"setup: {HISTORY:,} finished jobs in {time.perf_counter() - t0:.1f} s")
        samples: dict[str, list[float]] = {empty: [], full: []}
        passes(empty, 3), passes(full, 3)  # warm both up
        for _ in range(BLOCKS):
            for db_name in (empty, full):
                samples[db_name] += passes(db_name, PASSES)
    finally:
        for session in SESSIONS:
            session.close()
        logging.disable(logging.NOTSET)
        if "django.db" in sys.modules:
            from django.db import connection

            connection.close()
        template.drop_all()
    base, grown = statistics.median(samples[empty]), statistics.median(samples[full])
    for label, db_name in (("0 finished jobs", empty), (f"{HISTORY:,} finished jobs", full)):
        times = samples[db_name]
        print(
            f"{label:>22}: idle pass median {statistics.median(times) * 1000:.2f} ms "
            f"(min {min(times) * 1000:.2f}, max {max(times) * 1000:.2f}, n={len(times)})"
        )
    ratio = grown / base
    print(
        f"ratio idle pass with {HISTORY:,} finished jobs / with none: {ratio:.2f} "
        f"(goal <= {GOAL}: {'met' if ratio <= GOAL else 'MISSED'})"
    )
