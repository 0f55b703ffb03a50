"""AVAILABLE and SOURCE_EVENT on a real cluster (Lane A).

- A paced BATCH FakeSource job's reader is woken by its availability future: the shared timers
  complete it when rows come due, and the AVAILABLE commands it admits into the reader's mailbox
  are counted in job detail (``sourceRuntime.available.wakeups``); every row arrives once.
- A STREAMING LocalFile job of 2 readers into PostgreSQL: one reader is given a very large file,
  then a burst of small files comes. The readers report their backlogs to the enumerator
  (SOURCE_EVENT) and most small files go to the other reader (round-robin would split them
  evenly); every row is in the table exactly once.
"""

from __future__ import annotations

import textwrap

import psycopg
import pytest

from tests.clusterkit import Cluster, wait_for, wait_for_api
from tests.test_jobs_cluster import TERMINAL, data_db, job, post, submit, wait_status
from tests.test_source_lane_a_cluster import HUGE_FILE, Inbox, group, localfile_job

__all__ = ["data_db"]

pytestmark = pytest.mark.cluster
SMALL_FILES, SMALL_ROWS = 20, 50


@pytest.fixture(scope="module")
def lanes(db_template):
    """3 workers of 1 slot: an enumerator and 2 readers, each on a worker of its own."""
    c = Cluster(db_template, masters=1, workers=3, slots=1, heartbeat_timeout=3.0)
    c.env["KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS"] = "FakeSource,LocalFile"
    with c:
        yield c


def test_a_paced_readers_availability_wakes_it_and_every_row_arrives(lanes, tmp_path):
    lanes.restore()
    out = tmp_path / "out"
    job_id = submit(
        lanes,
        textwrap.dedent(f"""
        env {{ job.mode = BATCH, parallelism = 1 }}
        source {{ FakeSource {{ row.num = 600, split.num = 2, rows.per-second = 300,
                               schema {{ fields {{ id = bigint }} }} }} }}
        sink {{ LocalFile {{ path = "{out}", file_format_type = csv }} }}
        """),
    )
    detail = wait_status(lanes, job_id, TERMINAL, timeout=90)
    assert detail["jobStatus"] == "FINISHED", detail
    assert detail["pipelines"][0]["sourceRuntime"]["lane"] == "A"
    ids = [int(line) for f in out.rglob("*.csv") for line in f.read_text().split() if line]
    assert sorted(ids) == list(range(600))
    available = group(detail, "READER")["sourceRuntime"]["available"]
    # 300 rows a split at 300 rows/s: the reader waits for its rows many times, each wait
    # ended by its future's AVAILABLE command (none lost for capacity)
    assert available["wakeups"] >= 10 and available["refused"] == 0, available
    assert available["admitted"] >= available["wakeups"]


def empty_table(data_db: str) -> str:
    """The sink's table, new and empty, with no key (duplicates show); its Jdbc URL."""
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS backlogs, backlogs__keel_stage")
        conn.execute("CREATE TABLE backlogs (id bigint, name text)")
    return "jdbc:" + data_db.replace("postgres://", "postgresql://")


def committed(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*), count(DISTINCT id) FROM backlogs").fetchone()


def test_new_files_go_to_the_reader_with_the_smaller_backlog(lanes, data_db, tmp_path):
    lanes.restore()
    inbox = Inbox(tmp_path / "inbox")
    inbox.directory.mkdir()
    url = empty_table(data_db)
    job_id = submit(
        lanes,
        localfile_job(
            inbox.directory,
            "job.mode = STREAMING, parallelism = 2, checkpoint.interval = 300",
            f'Jdbc {{ url = "{url}", user = root, password = t, table = backlogs }}',
            discovery=100,
        ),
    )

    def runtimes() -> tuple[dict, list[dict]]:
        detail = job(lanes, job_id)
        readers = [group(detail, "READER", i).get("sourceRuntime") or {} for i in (0, 1)]
        return group(detail, "ENUMERATOR").get("sourceRuntime") or {}, readers

    try:
        wait_for_api(  # both readers told the enumerator they hold nothing
            lambda: runtimes()[0].get("sourceEvents", {}).get("received", 0) >= 2,
            60,
            what="both readers' backlogs",
        )
        inbox.drop(HUGE_FILE)
        wait_for(
            lambda: 2000 < committed(data_db)[0] < HUGE_FILE // 2,
            60,
            interval=0.05,
            what="the large file partly committed",
        )
        for _ in range(SMALL_FILES):  # a burst while one reader is busy with the large file
            inbox.drop(SMALL_ROWS)
        wait_for(
            lambda: committed(data_db) == (inbox.rows, inbox.rows),
            120,
            interval=0.2,
            what=f"all {inbox.files} files committed",
        )

        def added() -> list[int]:
            return [r.get("reader", {}).get("splitsAdded", 0) for r in runtimes()[1]]

        counts = wait_for_api(
            lambda: sum(a := added()) == 1 + SMALL_FILES and a, 15, what="the readers' reports"
        )
        enumerator, readers = runtimes()
        big = max((0, 1), key=lambda i: readers[i]["poll"]["records"])  # the large file's
        other = 1 - big
        # round-robin gives each 10 of the 20: the other reader's backlog was smaller
        assert counts[other] >= SMALL_FILES - 4, (counts, enumerator["sourceEvents"])
        assert enumerator["sourceEvents"]["byBacklog"] >= SMALL_FILES // 2 - 4
        assert enumerator["sourceEvents"]["invalid"] == 0
        assert all(r["sourceEvents"]["sent"] >= 1 for r in readers)
    finally:
        assert post(lanes, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
        assert wait_status(lanes, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"
    with psycopg.connect(data_db) as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM backlogs"))
    assert ids == list(range(inbox.rows))  # every row exactly once
