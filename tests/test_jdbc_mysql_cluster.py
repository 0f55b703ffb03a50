"""A checkpointed job writing a keyless MySQL table (a private MariaDB) on a real cluster: a
kill -9 of the worker running its sink, once checkpoints have committed rows, costs no row and
duplicates none (the stage, the fence row and the restore's commit, engine.connectors.mysql
.writers)."""

from __future__ import annotations

import signal
import textwrap

import pytest

from tests.clusterkit import Cluster, wait_for
from tests.mariadbkit import PASSWORD, USER, mariadb
from tests.test_final_checkpoint import group
from tests.test_jobs_cluster import TERMINAL, job, submit, wait_status

__all__ = ["mariadb"]

pytestmark = pytest.mark.cluster
SPLITS, ROWS = 2, 1500


@pytest.fixture(scope="module")
def mc(db_template):
    """Two workers: the reader moves to the other one when its worker dies."""
    with Cluster(db_template, masters=1, workers=2, slots=2, heartbeat_timeout=2.0) as c:
        yield c


def test_a_worker_killed_mid_job_leaves_every_row_in_mysql_exactly_once(mc, mariadb):
    mariadb.execute("DROP TABLE IF EXISTS killed", "CREATE TABLE killed (id bigint, name text)")
    job_id = submit(
        mc,
        textwrap.dedent(f"""
        env {{ job.mode = BATCH, parallelism = 1, checkpoint.interval = 2000,
              job.retry.interval.seconds = 0 }}
        source {{ FakeSource {{ split.num = {SPLITS}, row.num = {ROWS}, rows.per-second = 150,
                               schema {{ fields {{ id = bigint, name = string }} }} }} }}
        sink {{ Jdbc {{ url = "{mariadb.url}", driver = "com.mysql.cj.jdbc.Driver",
                       user = {USER}, password = {PASSWORD}, table = killed }} }}
        """),
    )

    def committed() -> int:
        return mariadb.execute("SELECT count(*) FROM killed")[0][0]

    def staged() -> int:  # rows after the newest checkpoint: the kill leaves them behind
        return mariadb.execute("SELECT count(*) FROM killed__keel_stage WHERE keel_mark = 0")[0][0]

    wait_for(
        lambda: mc.checkpoints_completed(job_id) >= 1 and committed() > 0 and staged() > 0,
        60,
        interval=0.05,
        what="a checkpoint's rows in the MySQL table, and rows staged after it",
    )
    detail = job(mc, job_id)
    reader = group(detail, "READER", 0)
    assert detail["jobStatus"] == "RUNNING" and reader["status"] == "RUNNING", detail
    before = committed()
    assert before < ROWS, "the job wrote everything before the kill: pace it slower"
    mc.signal(reader["member"]["name"], signal.SIGKILL)

    detail = wait_status(mc, job_id, TERMINAL, timeout=180)
    assert detail["jobStatus"] == "FINISHED", detail["errorMsg"]
    assert detail["pipelines"][0]["restoreCount"] >= 1
    rows, distinct, low, high = mariadb.execute(
        "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM killed"
    )[0]
    assert (rows, distinct) == (ROWS, ROWS), f"{before} rows committed before the kill"
    assert (low, high) == (0, ROWS - 1)
    # Nothing is left staged: every attempt's rows moved, or were dropped and replayed.
    assert mariadb.execute("SELECT count(*) FROM killed__keel_stage") == [(0,)]
