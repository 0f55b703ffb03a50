"""A checkpointed batch reader that read all its input commits through a final checkpoint
before it ends: a restore of its pipeline (another reader's worker lost) never replays what it
committed, and a keyless target gets every row exactly once."""

from __future__ import annotations

import signal
import textwrap

import psycopg
import pytest

from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import TERMINAL, data_db, job, submit, wait_status

__all__ = ["data_db"]  # a fixture shared with the jobs tests

pytestmark = pytest.mark.cluster
SMALL, LARGE = 20_000, 600_000


@pytest.fixture(scope="module")
def fc(db_template):
    """One slot per worker: a pipeline's task groups land on different workers (one master: no
    master is hurt here)."""
    with Cluster(db_template, masters=1, workers=4, slots=1, heartbeat_timeout=2.0) as c:
        yield c


def group(detail: dict, kind: str, index: int) -> dict:
    groups = detail["pipelines"][0]["taskGroups"]
    return next(g for g in groups if g["kind"] == kind and g["index"] == index)


def test_a_finished_reader_is_not_replayed_when_another_reader_is_lost(fc, data_db):
    """Skewed splits (20,000 and 600,000 rows), parallelism 2, checkpoints every second, a
    keyless target: once reader 0 is FINISHED, kill -9 reader 1's worker."""
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE src (id bigint PRIMARY KEY, name text)")
        conn.execute(
            f"INSERT INTO src SELECT g, 'n' || g FROM generate_series(0, {SMALL - 1}) g "
            f"UNION ALL SELECT g, 'n' || g FROM generate_series(1000000, {1000000 + LARGE - 1}) g"
        )
        conn.execute("CREATE TABLE dst (id bigint, name text)")  # no key: duplicates show
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    job_id = submit(
        fc,
        textwrap.dedent(f"""
        env {{ job.mode = BATCH, parallelism = 2, checkpoint.interval = 1000,
              job.retry.interval.seconds = 0 }}
        source {{ Jdbc {{ url = "{url}", user = root, password = t, table = src, split.num = 2 }} }}
        sink {{ Jdbc {{ url = "{url}", user = root, password = t, table = dst }} }}
    """),
    )
    detail = wait_for(
        lambda: (d := job(fc, job_id)) and group(d, "READER", 0)["status"] == "FINISHED" and d,
        120,
        interval=0.02,
        what="reader 0 to finish",
    )
    busy = group(detail, "READER", 1)
    assert busy["status"] == "RUNNING", "reader 1 ended first: the splits are not skewed enough"
    victim = busy["member"]["name"]
    fc.signal(victim, signal.SIGKILL)
    detail = wait_status(fc, job_id, TERMINAL, timeout=180)
    assert detail["jobStatus"] == "FINISHED", detail["errorMsg"]
    assert detail["pipelines"][0]["restoreCount"] == 1
    with psycopg.connect(data_db) as conn:
        rows, distinct = conn.execute("SELECT count(*), count(DISTINCT id) FROM dst").fetchone()
    assert (rows, distinct) == (SMALL + LARGE, SMALL + LARGE)
