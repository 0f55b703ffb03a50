"""Reader failover on a real cluster: a Lane A reader whose worker is killed restores alone.

- A STREAMING LocalFile job in Lane A into Jdbc: kill -9 of a reader's worker while large
  files are being committed restores that reader only (its attempt 2), while the enumerator and
  the other reader keep attempt 1 and the pipeline never leaves RUNNING; the enumerator hands
  the files dropped before, during and after the loss to the readers' current attempts, and
  every row is in the table exactly once.
- A Lane B job (FakeSource, not on this cluster's allow-list) that loses a reader's worker
  still restores the whole pipeline: every task group's attempt becomes 2.
"""

from __future__ import annotations

import signal
import textwrap

import psycopg
import pytest

from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import TERMINAL, data_db, job, post, submit, wait_status
from tests.test_source_lane_a_cluster import (
    HUGE_FILE,
    Inbox,
    committed,
    group,
    start_streaming_into_table,
)

__all__ = ["data_db"]

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def readers(db_template):
    """4 workers of 1 slot: an enumerator and 2 readers each on a worker of its own, and one
    free to restore a reader onto. Only LocalFile runs in Lane A here."""
    c = Cluster(db_template, masters=1, workers=4, slots=1, heartbeat_timeout=3.0)
    c.env["KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS"] = "LocalFile"
    with c:
        yield c


def attempts(detail: dict) -> dict[tuple[str, int], int]:
    return {(g["kind"], g["index"]): g["attempt"] for g in detail["pipelines"][0]["taskGroups"]}


def went_failing(c: Cluster, job_id: int) -> int:
    return c.one(
        "SELECT count(*) FROM engine_engineevent WHERE job_id = %s AND kind = 'pipeline.status'"
        " AND payload->>'to' = 'FAILING'",
        (job_id,),
    )


def test_a_killed_readers_worker_restores_that_reader_alone(readers, data_db, tmp_path):
    readers.restore()
    inbox = Inbox(tmp_path / "inbox")
    inbox.directory.mkdir()
    job_id = start_streaming_into_table(readers, data_db, inbox, retries=3)

    def all_read() -> bool:
        return committed(data_db) == (inbox.rows, inbox.rows)

    before = inbox.rows
    for _ in range(2):  # one for each reader (round-robin)
        inbox.drop(HUGE_FILE)
    # Reader 0 is killed once the large files are being committed: mostly in the middle of its
    # file (a checkpoint commits a part of it), else after it (a checkpoint took all of it).
    wait_for(
        lambda: committed(data_db)[0] > before + 2000,
        30,
        interval=0.02,
        what="the large files being committed",
    )
    detail = job(readers, job_id)
    assert attempts(detail) == {("ENUMERATOR", 0): 1, ("READER", 0): 1, ("READER", 1): 1}
    victim = group(detail, "READER", 0)["member"]["name"]
    hosts = {
        group(detail, kind, i)["member"]["name"] for kind, i in (("ENUMERATOR", 0), ("READER", 1))
    }
    assert victim not in hosts
    readers.signal(victim, signal.SIGKILL)
    for _ in range(3):  # dropped while the reader is being restored
        inbox.drop()
    wait_for(
        lambda: (
            (d := job(readers, job_id))["pipelines"][0]["restoreCount"] == 1
            and group(d, "READER", 0)["status"] == "RUNNING"
        ),
        30,
        interval=0.1,
        what="the reader's restore",
    )
    readers.start(victim)
    for _ in range(2):  # dropped after it
        inbox.drop()
    wait_for(all_read, 90, interval=0.2, what=f"all {inbox.files} files")

    detail = job(readers, job_id)
    assert attempts(detail) == {("ENUMERATOR", 0): 1, ("READER", 0): 2, ("READER", 1): 1}
    pipeline = detail["pipelines"][0]
    assert (detail["jobStatus"], pipeline["status"], pipeline["restoreCount"]) == (
        "RUNNING",
        "RUNNING",
        1,
    )
    assert went_failing(readers, job_id) == 0
    with psycopg.connect(data_db) as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM lane_a"))
    assert ids == list(range(inbox.rows))  # every row, each once
    assert post(readers, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    assert wait_status(readers, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"


def test_a_lane_b_job_that_loses_a_reader_restores_the_whole_pipeline(readers):
    readers.restore()
    job_id = submit(
        readers,
        textwrap.dedent("""
        env { job.mode = STREAMING, parallelism = 2, job.retry.interval.seconds = 0 }
        source { FakeSource { rows.per-second = 100,
                              schema { fields { id = bigint } } } }
        sink { Blackhole { } }
        """),
    )
    detail = wait_status(readers, job_id, {"RUNNING"}, timeout=30)
    assert detail["pipelines"][0]["sourceRuntime"]["lane"] == "B"
    victim = group(detail, "READER", 0)["member"]["name"]
    assert victim != group(detail, "ENUMERATOR")["member"]["name"]
    readers.signal(victim, signal.SIGKILL)
    wait_for(
        lambda: (
            (p := job(readers, job_id)["pipelines"][0])["restoreCount"] == 1
            and p["status"] == "RUNNING"
        ),
        30,
        interval=0.1,
        what="the pipeline's restore",
    )
    assert set(attempts(job(readers, job_id)).values()) == {2}
    assert went_failing(readers, job_id) == 1
    assert post(readers, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    assert wait_status(readers, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"
