"""Recovery from worker loss on a real cluster (kill -9), restores bounded by job.retry.times."""

from __future__ import annotations

import json
import signal
import textwrap
import time

import psycopg
import pytest

from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import TERMINAL, data_db, job, post, submit, wait_status

__all__ = ["data_db"]  # a fixture shared with the jobs tests

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def rc(db_template):
    """3 workers of 4 fixed slots: room to restore a pipeline after losing a worker."""
    with Cluster(db_template, masters=2, workers=3, slots=4, heartbeat_timeout=3.0) as c:
        yield c


def reader_member(detail: dict, index: int = 0) -> str:
    groups = detail["pipelines"][0]["taskGroups"]
    reader = next(g for g in groups if g["kind"] == "READER" and g["index"] == index)
    return reader["member"]["name"]


def kill(c: Cluster, name: str) -> float:
    c.signal(name, signal.SIGKILL)
    return time.monotonic()


def restored(c: Cluster, job_id: int, count: int):
    """The job detail once its pipeline has been restored ``count`` times and runs again."""
    d = job(c, job_id)
    p = d["pipelines"][0]
    return p["restoreCount"] == count and p["status"] == "RUNNING" and d


def kill_reader_until_restore_requested(c: Cluster, job_id: int) -> str:
    """kill -9 the member running reader 0; return its name once the restore is requested."""
    victim = reader_member(wait_status(c, job_id, {"RUNNING"}, timeout=30))
    kill(c, victim)
    wait_for(
        lambda: c.one("SELECT count(*) FROM engine_controlstep WHERE job_id = %s", (job_id,)) == 1,
        10,
        what="the restore to be requested",
    )
    return victim


def test_batch_job_survives_a_killed_worker_with_the_exact_row_set(rc, tmp_path):
    """Batch FakeSource -> LocalFile, a worker killed mid-run:
    FINISHED, exactly the expected rows, none twice (the pipeline restarts from the start)."""
    rc.restore()
    out = tmp_path / "out"
    job_id = submit(
        rc,
        textwrap.dedent(f"""
        env {{ job.mode = BATCH, parallelism = 2, job.retry.interval.seconds = 0 }}
        source {{ FakeSource {{ row.num = 1200, split.num = 4, rows.per-second = 300,
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
    assert sorted(ids) == list(range(2400))  # row.num rows for each of the 2 readers
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
        "source { FakeSource { rows.per-second = 100, endless = true } }\n"
        "sink { Blackhole {} }",
    )
    first = reader_member(wait_status(rc, job_id, {"RUNNING"}, timeout=30))
    killed_at = kill(rc, first)
    detail = wait_for(
        lambda: restored(rc, job_id, 1), 10, interval=0.02, what="the pipeline to run again"
    )
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
        "source { FakeSource { rows.per-second = 100, endless = true } }\n"
        "sink { Blackhole {} }",
    )
    victim = kill_reader_until_restore_requested(rc, job_id)
    assert post(rc, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    assert wait_status(rc, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"
    rc.start(victim)


def test_recovery_completes_under_a_new_master_without_running_a_task_group_twice(rc):
    """Kill -9 the active master while a recovery is under way: the new
    master finishes it, and no task group ever ran two attempts at once (attempt fencing)."""
    rc.restore()
    job_id = submit(
        rc,
        "env { job.mode = STREAMING, parallelism = 2,\n"
        "      job.retry.interval.seconds = 2 }\n"
        "source { FakeSource { split.num = 2, rows.per-second = 100, endless = true } }\n"
        "sink { Blackhole {} }",
    )
    kill_reader_until_restore_requested(rc, job_id)
    # The restore is requested (due in 2 s): now the active master dies as well.
    epoch, master = rc.active_master()
    kill(rc, master)
    detail = wait_for(
        lambda: restored(rc, job_id, 1), 20, interval=0.05, what="the restore under the new master"
    )
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


EXACTLY_ONCE = """
env {{ job.mode = STREAMING, parallelism = 2, checkpoint.interval = 1000,
      job.retry.interval.seconds = 0, job.retry.times = {retries} }}
source {{ FakeSource {{ split.num = 2, rows.per-second = 200, endless = true,
                       schema {{ fields {{ id = bigint, name = string }} }} }} }}
sink {{ Jdbc {{ url = "{url}", user = root, password = t, table = eo }} }}
"""


def completed_checkpoints(c: Cluster, job_id: int) -> int:
    return job(c, job_id)["checkpoints"]["completed"]


def assert_unbroken_runs(ids: list[int], splits: int) -> None:
    """No key twice, and for every split the keys form an unbroken run from its first key."""
    assert ids, "nothing was committed"
    assert len(ids) == len(set(ids)), "duplicated rows"
    for s in range(splits):
        mine = sorted(i for i in ids if i % splits == s)
        assert mine == list(range(s, s + splits * len(mine), splits)), f"lost rows in split {s}"


def assert_the_newest_cut_committed(c: Cluster, job_id: int, ids: list[int]) -> None:
    """What the sink committed is exactly the newest completed checkpoint's cut (the rows its
    readers had read), and every reader recorded committing it: a sink that stopped committing
    after a restore leaves fewer rows than the cut, however unbroken they are."""
    cut, readers, committed = c.newest_completed_cut(job_id)
    assert readers == committed == 2, (readers, committed)
    assert len(ids) == cut, f"{len(ids)} rows committed, the newest completed cut has {cut}"


def assert_exactly_once(c: Cluster, job_id: int, url: str, splits: int) -> int:
    """The table holds the newest completed cut, each row once; the stage keeps only rows read
    after it (never a committed checkpoint's, never a committed key)."""
    newest = c.one(
        "SELECT max(id) FROM engine_checkpoint WHERE job_id = %s AND state = 'COMPLETED'",
        (job_id,),
    )
    with psycopg.connect(url) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM eo").fetchall()]
        # Data rows, and the marks of checkpoints (a committed one's mark leaves with its rows).
        staged = conn.execute("SELECT id, keel_checkpoint FROM eo__keel_stage").fetchall()
    assert_unbroken_runs(ids, splits)
    assert_the_newest_cut_committed(c, job_id, ids)
    assert not [cp for _, cp in staged if cp is not None and cp <= newest], "committed, staged"
    assert not {i for i, _ in staged} & set(ids), "a staged row's key is committed already"
    return len(ids)


def start_exactly_once_job(c: Cluster, data_db: str, retries: int) -> tuple[int, str]:
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS eo, eo__keel_stage")
        conn.execute("CREATE TABLE eo (id bigint, name text)")  # no key: duplicates would show
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    job_id = submit(c, EXACTLY_ONCE.format(url=url, retries=retries))
    wait_status(c, job_id, {"RUNNING"}, timeout=30)
    wait_for(
        lambda: completed_checkpoints(c, job_id) >= 2,
        20,
        interval=0.1,
        what="two completed checkpoints",
    )
    return job_id, url


def stop_and_check(c: Cluster, job_id: int, data_db: str) -> int:
    assert post(c, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    assert wait_status(c, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"
    return assert_exactly_once(c, job_id, data_db, 2)


def test_streaming_to_jdbc_survives_a_killed_reader_exactly_once(rc, data_db):
    """Kill -9 the worker holding a reader: RUNNING again on other slots within 3 s; after
    cancel the table holds the newest completed checkpoint's cut, every key once."""
    rc.restore()
    job_id, _ = start_exactly_once_job(rc, data_db, retries=3)
    victim = reader_member(job(rc, job_id))
    killed_at = kill(rc, victim)
    wait_for(lambda: restored(rc, job_id, 1), 10, interval=0.02, what="the restore")
    assert time.monotonic() - killed_at < 3.0
    before = completed_checkpoints(rc, job_id)
    wait_for(
        lambda: completed_checkpoints(rc, job_id) >= before + 2,
        20,
        interval=0.1,
        what="checkpoints after the restore",
    )
    # Checkpoint ids only grow; at most checkpoint.max-retained (3) completed ones are kept
    # for restores, while the API lists the history (the job's last 100).
    summary = job(rc, job_id)["checkpoints"]
    code, listed = rc.api(f"/api/v1/jobs/{job_id}/checkpoints")
    assert code == 200 and summary["completed"] >= 4
    completed = [c for c in listed if c["state"] == "COMPLETED"]
    assert len(completed) >= 4
    retained = rc.one(
        "SELECT count(*) FROM engine_checkpoint WHERE job_id = %s AND state = 'COMPLETED'",
        [job_id],
    )
    assert 1 <= retained <= 3
    ids = [c["checkpointId"] for c in listed]
    assert ids == sorted(ids, reverse=True)
    assert all(c["durationMs"] is not None and c["durationMs"] >= 0 for c in completed)
    assert summary["latestId"] >= completed[0]["checkpointId"]
    assert stop_and_check(rc, job_id, data_db) > 0
    rc.start(victim)


def test_five_kills_in_a_row_lose_and_duplicate_nothing(rc, data_db):
    """Five kills (the killed worker restarted in between),
    job.retry.times = 10: zero lost, zero duplicated rows."""
    rc.restore()
    job_id, _ = start_exactly_once_job(rc, data_db, retries=10)
    for n in range(1, 6):
        victim = reader_member(job(rc, job_id), index=n % 2)
        kill(rc, victim)
        wait_for(lambda n=n: restored(rc, job_id, n), 15, interval=0.05, what=f"restore {n}")
        rc.start(victim)
        before = completed_checkpoints(rc, job_id)
        wait_for(
            lambda b=before: completed_checkpoints(rc, job_id) > b,
            20,
            interval=0.1,
            what="a checkpoint after the restore",
        )
    assert stop_and_check(rc, job_id, data_db) > 0


def test_streaming_to_local_files_commits_a_part_per_checkpoint_exactly_once(rc, tmp_path):
    """LocalFile commits a file part per checkpoint: after a kill -9 and a restore, the
    published parts hold the newest completed cut, every key once."""
    rc.restore()
    out = tmp_path / "parts"
    job_id = submit(
        rc,
        textwrap.dedent(f"""
        env {{ job.mode = STREAMING, parallelism = 2, checkpoint.interval = 1000,
              job.retry.interval.seconds = 0 }}
        source {{ FakeSource {{ split.num = 2, rows.per-second = 200, endless = true,
                               schema {{ fields {{ id = bigint, name = string }} }} }} }}
        sink {{ LocalFile {{ path = "{out}", file_format_type = json }} }}
    """),
    )
    wait_status(rc, job_id, {"RUNNING"}, timeout=30)
    wait_for(
        lambda: completed_checkpoints(rc, job_id) >= 2,
        20,
        interval=0.1,
        what="two completed checkpoints",
    )
    assert list(out.glob("part-*.jsonl")), "a part per completed checkpoint is published"
    victim = reader_member(job(rc, job_id))
    kill(rc, victim)
    wait_for(lambda: restored(rc, job_id, 1), 10, interval=0.02, what="the restore")
    before = completed_checkpoints(rc, job_id)
    wait_for(
        lambda: completed_checkpoints(rc, job_id) >= before + 2,
        20,
        interval=0.1,
        what="checkpoints after the restore",
    )
    assert post(rc, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    wait_status(rc, job_id, {"CANCELED"}, timeout=30)
    ids = [
        json.loads(line)["id"]
        for part in out.glob("part-*.jsonl")
        for line in part.read_text().splitlines()
    ]
    assert_unbroken_runs(ids, 2)
    assert_the_newest_cut_committed(rc, job_id, ids)
