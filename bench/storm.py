"""A failover storm: the active master and a worker killed at the same instant under streaming,
dirty-tracked jobs, and the time until every job runs again on live members.

The cluster is the one recovery is judged on: 3 masters, 4 workers of fixed slots, a 3 s
heartbeat timeout. For 10 and for 100 jobs it kills (SIGKILL) the active master and the worker
hosting most task groups together, ``ROUNDS`` times, and beside that a worker alone. Times come
from the engine's own records (the event store's timestamps, on the database's clock): for each
job that lost a task group, from the kill to the last of its task groups reporting RUNNING
again. It prints the median and max over those jobs, and the median timeline of the restore
path (next master elected, member removed, task groups failed, restore, deploy, RUNNING), which
shows where the time goes. The cluster runs on a PostgreSQL server of its own (every task group
holds a session: 100 jobs need more than a default server allows).
"""

from __future__ import annotations

import os
import signal
import statistics
import time

from tests.clusterkit import Cluster, DatabaseTemplate, wait_for
from tests.faultkit import PrivatePostgres

ROUNDS = int(os.environ.get("KEEL_BENCH_STORM_ROUNDS", "3"))
SIZES = tuple(int(n) for n in os.environ.get("KEEL_BENCH_STORM_JOBS", "10,100").split(","))
GOALS = {10: 1.5, 100: 3.0}
WORKERS = 4
HEARTBEAT_TIMEOUT = 3.0
CHECKPOINT_MS = int(os.environ.get("KEEL_BENCH_STORM_CHECKPOINT_MS", "1000"))

JOB = """
env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = CHECKPOINT_MS,
      job.retry.interval.seconds = 0, job.retry.times = 1000, job.dirty-task.threshold = 100 }
source { FakeSource { rows.per-second = 20, endless = true } }
sink { Blackhole { } }
"""

#: The restore path's marks, in order: (label, SQL giving each affected job's time of it).
MARKS = (
    ("task groups failed", "kind = 'taskgroup.status' AND payload->>'to' = 'FAILED'", min),
    ("others ended", "kind = 'taskgroup.status' AND payload->>'to' IN ('CANCELED', 'FAILED')", max),
    ("restore requested", "kind = 'pipeline.restore-requested'", min),
    ("restore", "kind = 'pipeline.restore'", min),
    ("deploying", "kind = 'taskgroup.status' AND payload->>'to' = 'DEPLOYING'", max),
    ("running", "kind = 'taskgroup.status' AND payload->>'to' = 'RUNNING'", max),
)


def slots_for(jobs: int) -> int:
    """Fixed slots per worker: every job's two task groups on three workers, with room."""
    return max(8, -(-jobs * 2 // (WORKERS - 1)) + 4)


def everything_running(cluster: Cluster, jobs: int) -> bool:
    return (
        cluster.one(
            "SELECT count(DISTINCT j.id) FROM engine_job j WHERE j.status = 'RUNNING' AND NOT"
            " EXISTS (SELECT 1 FROM engine_taskgroup t JOIN engine_member m ON m.id = t.member_id"
            "  WHERE t.job_id = j.id AND (t.status <> 'RUNNING' OR m.state <> 'ALIVE'))"
        )
        == jobs
    )


def victim_worker(cluster: Cluster) -> str:
    return cluster.one(
        "SELECT m.name FROM engine_member m JOIN engine_taskgroup t ON t.member_id = m.id"
        " WHERE m.state = 'ALIVE' AND t.status = 'RUNNING'"
        " GROUP BY m.name ORDER BY count(*) DESC, m.name LIMIT 1"
    )


def storm(cluster: Cluster, jobs: int, kill_master: bool) -> tuple[list[float], dict[str, float]]:
    """One round; (per affected job: seconds to RUNNING again, {mark: median seconds})."""
    cluster.restore()
    _, master = wait_for(cluster.active_master, 20, what="an active master")
    wait_for(lambda: everything_running(cluster, jobs), 300, interval=0.5, what="every job")
    victim = victim_worker(cluster)
    affected = [
        row[0]
        for row in cluster.query(
            "SELECT DISTINCT t.job_id FROM engine_taskgroup t JOIN engine_member m"
            " ON m.id = t.member_id WHERE m.name = %s AND m.state = 'ALIVE'",
            (victim,),
        )
    ]
    after = cluster.one("SELECT coalesce(max(seq), 0) FROM engine_engineevent")
    killed_at = cluster.one("SELECT extract(epoch FROM clock_timestamp())::float8")
    if kill_master:
        os.kill(cluster.pid(master), signal.SIGKILL)
    os.kill(cluster.pid(victim), signal.SIGKILL)
    wait_for(
        lambda: (
            everything_running(cluster, jobs)
            and cluster.one(
                "SELECT count(DISTINCT job_id) FROM engine_engineevent WHERE seq > %s"
                " AND kind = 'taskgroup.status' AND payload->>'to' = 'RUNNING'",
                (after,),
            )
            >= len(affected)
        ),
        120,
        interval=0.2,
        what="every job to run again",
    )

    def since(sql: str, params: tuple = ()) -> float | None:
        value = cluster.one(
            f"SELECT extract(epoch FROM min(at))::float8 FROM engine_engineevent"
            f" WHERE seq > %s AND {sql}",
            (after, *params),
        )
        return None if value is None else value - killed_at

    timeline: dict[str, float] = {}
    if kill_master:
        timeline["master elected"] = since("kind = 'master.elected'")
    timeline["member removed"] = since("kind = 'member.removed'")
    per_job: dict[str, list[float]] = {label: [] for label, _, _ in MARKS}
    for job_id in affected:
        for label, where, pick in MARKS:
            rows = cluster.query(
                f"SELECT extract(epoch FROM at)::float8 FROM engine_engineevent"
                f" WHERE seq > %s AND job_id = %s AND {where}",
                (after, job_id),
            )
            if rows:
                per_job[label].append(pick(r[0] for r in rows) - killed_at)
    steps = cluster.query(
        "SELECT extract(epoch FROM min(due_at))::float8,"
        " extract(epoch FROM min(enqueued_at))::float8 FROM engine_controlstep"
        " WHERE created_at >= to_timestamp(%s) GROUP BY job_id",
        (killed_at,),
    )
    if steps:
        timeline["step due"] = statistics.median(s[0] - killed_at for s in steps)
        timeline["step enqueued"] = statistics.median(s[1] - killed_at for s in steps if s[1])
    for label, values in per_job.items():
        if values:
            timeline[label] = statistics.median(values)
    return per_job["running"], timeline


def run_size(template: DatabaseTemplate, jobs: int) -> None:
    cluster = Cluster(
        template,
        masters=3,
        workers=WORKERS,
        slots=slots_for(jobs),
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
    )
    try:
        cluster.up()
        for _ in range(jobs):
            code, body = cluster.post(
                "/api/v1/jobs", {"config": JOB.replace("CHECKPOINT_MS", str(CHECKPOINT_MS))}
            )
            assert code == 201, body
        for kill_master, what in ((True, "master + worker"), (False, "worker alone")):
            times: list[float] = []
            marks: dict[str, list[float]] = {}
            for _ in range(ROUNDS):
                running, timeline = storm(cluster, jobs, kill_master)
                times += running
                for label, value in timeline.items():
                    if value is not None:
                        marks.setdefault(label, []).append(value)
            goal = f" (goal <= {GOALS[jobs]:.1f} s)" if kill_master and jobs in GOALS else ""
            print(
                f"{jobs} jobs, {what} killed: {len(times)} job restores over {ROUNDS} rounds,"
                f" to RUNNING median {statistics.median(times):.2f} s"
                f" max {max(times):.2f} s{goal}"
            )
            print(
                "  timeline (median s after the kill): "
                + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in marks.items())
            )
    finally:
        cluster.down()


def main() -> None:
    # A server of its own: every task group holds a session, more than a default server allows.
    with PrivatePostgres({"max_connections": 400}) as postgres:
        template = DatabaseTemplate(postgres.url)
        try:
            for jobs in SIZES:
                started = time.monotonic()
                run_size(template, jobs)
                print(f"  ({jobs} jobs: {time.monotonic() - started:.0f} s)")
        finally:
            template.drop_all()


if __name__ == "__main__":
    main()
