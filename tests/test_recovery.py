"""Recovery from worker loss on a real cluster (kill -9), restores bounded by job.retry.times."""

from __future__ import annotations

import signal
import textwrap
import time

import pytest

from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import TERMINAL, job, post, submit, wait_status

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def rc(db_template):
    """3 workers of 4 fixed slots: room to restore a pipeline after losing a worker."""
    c = Cluster(db_template, masters=2, workers=3, slots=4, heartbeat_timeout=3.0)
    try:
        c.up()
        yield c
    finally:
        c.down()


def reader_member(detail: dict, index: int = 0) -> str:
    groups = detail["pipelines"][0]["taskGroups"]
    reader = next(g for g in groups if g["kind"] == "READER" and g["index"] == index)
    return reader["member"]["name"]


def kill(c: Cluster, name: str) -> float:
    c.signal(name, signal.SIGKILL)
    return time.monotonic()


def test_batch_job_survives_a_killed_worker_with_the_exact_row_set(rc, tmp_path):
    """Issue 4, acceptance 5: batch FakeSource -> LocalFile, a worker killed mid-run:
    FINISHED, exactly the expected rows, none twice (the pipeline restarts from the start)."""
    rc.restore()
    out = tmp_path / "out"
    job_id = submit(
        rc,
        textwrap.dedent(f"""
        env {{ job.mode = BATCH, parallelism = 2, job.retry.interval.seconds = 0 }}
        source {{ FakeSource {{ row.num = 600, split.num = 4, rows.per-second = 300,
                               schema {{ fields {{ id = bigint, name = string }} }} }} }}
        sink {{ LocalFile {{ path = "{out}", file_format_type = csv }} }}
    """),
    )
    wait_for(
        lambda: all(
            g["metrics"]["sourceReceivedCount"] > 0 or g["kind"] == "ENUMERATOR"
            for g in job(rc, job_id)["pipelines"][0]["taskGroups"]
        ),
        30,
        interval=0.1,
        what="both readers to be reading",
    )
    victim = reader_member(job(rc, job_id))
    kill(rc, victim)
    detail = wait_status(rc, job_id, TERMINAL, timeout=90)
    assert detail["jobStatus"] == "FINISHED", detail["errorMsg"]
    assert detail["pipelines"][0]["restoreCount"] == 1
    ids = [
        int(line.split(",")[0])
        for part in out.glob("part-*.csv")
        for line in part.read_text().splitlines()
    ]
    assert sorted(ids) == list(range(2400))
    rc.start(victim)


def test_restore_runs_again_within_3s_and_the_retry_limit_fails_the_job(rc):
    """A lost reader's pipeline is RUNNING again on other slots within 3 s of the kill
    (job.retry.interval.seconds = 0); with job.retry.times = 1 a second loss FAILS the job,
    and errorMsg names the lost member."""
    rc.restore()
    job_id = submit(
        rc,
        "env { job.mode = STREAMING, parallelism = 1, job.retry.times = 1,\n"
        "      job.retry.interval.seconds = 0 }\n"
        "source { FakeSource { rows.per-second = 100 } }\nsink { Blackhole {} }",
    )
    first = reader_member(wait_status(rc, job_id, {"RUNNING"}, timeout=30))
    killed_at = kill(rc, first)

    def restored():
        d = job(rc, job_id)
        p = d["pipelines"][0]
        return p["restoreCount"] == 1 and p["status"] == "RUNNING" and d

    detail = wait_for(restored, 10, interval=0.02, what="the pipeline to run again")
    assert time.monotonic() - killed_at < 3.0
    assert detail["jobStatus"] == "RUNNING"
    groups = detail["pipelines"][0]["taskGroups"]
    assert all(g["attempt"] == 2 and g["member"]["name"] != first for g in groups)
    rc.start(first)

    second = reader_member(detail)
    second_uuid = rc.one(
        "SELECT uuid::text FROM engine_member WHERE name = %s AND state = 'ALIVE'", (second,)
    )
    kill(rc, second)
    detail = wait_status(rc, job_id, TERMINAL, timeout=30)
    assert detail["jobStatus"] == "FAILED"
    assert second in detail["errorMsg"] and second_uuid in detail["errorMsg"]
    assert "job.retry.times = 1" in detail["errorMsg"]
    rc.start(second)
    # Every restore was a durable control step, done exactly once.
    steps = rc.query("SELECT key, state FROM engine_controlstep WHERE job_id = %s", (job_id,))
    assert len(steps) == 1 and steps[0][1] == "DONE"


def test_cancel_during_a_pending_restore_cancels_the_job(rc):
    rc.restore()
    job_id = submit(
        rc,
        "env { job.mode = STREAMING, parallelism = 1,\n"
        "      job.retry.interval.seconds = 30 }\n"
        "source { FakeSource { rows.per-second = 100 } }\nsink { Blackhole {} }",
    )
    victim = reader_member(wait_status(rc, job_id, {"RUNNING"}, timeout=30))
    kill(rc, victim)
    wait_for(
        lambda: rc.one("SELECT count(*) FROM engine_controlstep WHERE job_id = %s", (job_id,)) == 1,
        10,
        what="the restore to be requested",
    )
    assert post(rc, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    assert wait_status(rc, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"
    rc.start(victim)


def test_recovery_completes_under_a_new_master_without_running_a_task_group_twice(rc):
    """Issue 4, acceptance 4: kill -9 the active master while a recovery is under way: the new
    master finishes it, and no task group ever ran two attempts at once (attempt fencing)."""
    rc.restore()
    job_id = submit(
        rc,
        "env { job.mode = STREAMING, parallelism = 2,\n"
        "      job.retry.interval.seconds = 2 }\n"
        "source { FakeSource { split.num = 2, rows.per-second = 100 } }\n"
        "sink { Blackhole {} }",
    )
    victim = reader_member(wait_status(rc, job_id, {"RUNNING"}, timeout=30))
    kill(rc, victim)
    # The restore is requested (due in 2 s): now the active master dies as well.
    wait_for(
        lambda: rc.one("SELECT count(*) FROM engine_controlstep WHERE job_id = %s", (job_id,)) == 1,
        10,
        what="the restore to be requested",
    )
    epoch, master = rc.active_master()
    kill(rc, master)

    def restored():
        d = job(rc, job_id)
        p = d["pipelines"][0]
        return p["restoreCount"] == 1 and p["status"] == "RUNNING" and d

    detail = wait_for(restored, 20, interval=0.05, what="the restore under the new master")
    assert rc.active_master()[0] > epoch
    assert rc.one("SELECT state FROM engine_controlstep WHERE job_id = %s", (job_id,)) == "DONE"
    assert all(g["attempt"] == 2 for g in detail["pipelines"][0]["taskGroups"])
    # Fencing: for every task group, attempt 1 ended before attempt 2 started running.
    rows = rc.query(
        """
        SELECT (payload->>'taskGroupId')::bigint, (payload->>'attempt')::int,
               payload->>'to', seq
          FROM engine_engineevent
         WHERE job_id = %s AND kind = 'taskgroup.status'
         ORDER BY seq
        """,
        (job_id,),
    )
    for group in {r[0] for r in rows}:
        ended = [
            seq
            for g, a, to, seq in rows
            if g == group and a == 1 and to in ("FAILED", "CANCELED", "FINISHED")
        ]
        started = [seq for g, a, to, seq in rows if g == group and a == 2 and to == "RUNNING"]
        assert ended and started and max(ended) < min(started), (group, rows)
    assert post(rc, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    wait_status(rc, job_id, {"CANCELED"}, timeout=30)
    rc.start(victim)
    rc.start(master)
