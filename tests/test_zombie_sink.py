"""Zombie sink sessions: a worker frozen in the middle of a Jdbc write (a COPY, or a
transaction it left open) neither stalls its reader's next attempt nor, once woken, lands a
row after that attempt took over. The next attempt ends the older attempts' sink sessions and
holds the writer's lock; the master ends a removed member's sink sessions too."""

from __future__ import annotations

import signal
import textwrap

import psycopg
import pytest

from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import data_db, job, post, submit, wait_status

__all__ = ["data_db"]  # a fixture shared with the jobs tests

pytestmark = pytest.mark.cluster


def reader_member(c: Cluster, job_id: int) -> str:
    groups = job(c, job_id)["pipelines"][0]["taskGroups"]
    return next(g for g in groups if g["kind"] == "READER")["member"]["name"]


def checkpoints_go_on(c: Cluster, job_id: int, what: str) -> None:
    before = c.checkpoints_completed(job_id)
    wait_for(lambda: c.checkpoints_completed(job_id) >= before + 2, 15, interval=0.05, what=what)


def freeze_the_writer(c: Cluster, job_id: int, restore: int) -> None:
    """SIGSTOP the reader's worker: it is restored elsewhere (restore number ``restore``) and
    checkpoints there while the zombie stays frozen; then SIGCONT it, and it exits."""
    c.restore()
    wait_status(c, job_id, {"RUNNING"}, timeout=30)
    checkpoints_go_on(c, job_id, "checkpoints")
    zombie = reader_member(c, job_id)
    c.signal(zombie, signal.SIGSTOP)
    try:
        wait_for(
            lambda: (
                c.one("SELECT restore_count FROM engine_pipeline WHERE job_id = %s", (job_id,))
                == restore
            ),
            15,
            interval=0.05,
            what="the restore",
        )
        checkpoints_go_on(c, job_id, "the next attempt to checkpoint beside the frozen zombie")
    finally:
        c.signal(zombie, signal.SIGCONT)  # woken, it finds itself fenced and exits
    wait_for(lambda: not c.alive(zombie), 15, what="the woken zombie to exit")


def test_a_worker_frozen_mid_write_stalls_nothing_and_lands_nothing(db_template, data_db):
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE dst (id bigint, name text)")
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    with Cluster(db_template, masters=1, workers=3, slots=2, heartbeat_timeout=2.0) as c:
        # Unpaced: the writer is inside a COPY or its transaction most of the time.
        job_id = submit(
            c,
            textwrap.dedent(f"""
            env {{ job.mode = STREAMING, parallelism = 1, checkpoint.interval = 500,
                  job.retry.interval.seconds = 0, job.retry.times = 10 }}
            source {{ FakeSource {{ endless = true,
                                   schema {{ fields {{ id = bigint, name = string }} }} }} }}
            sink {{ Jdbc {{ url = "{url}", user = root, password = t, table = dst }} }}
        """),
        )
        for restore in (1, 2, 3):
            freeze_the_writer(c, job_id, restore)
        assert post(c, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
        assert wait_status(c, job_id, {"CANCELED", "FAILED"})["jobStatus"] == "CANCELED"
        cut, _, _ = c.newest_completed_cut(job_id)
    with psycopg.connect(data_db) as conn:
        rows, distinct = conn.execute("SELECT count(*), count(DISTINCT id) FROM dst").fetchone()
    assert (rows, distinct) == (cut, cut)
