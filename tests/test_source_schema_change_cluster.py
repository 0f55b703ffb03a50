"""A source's schema change on a real cluster: a STREAMING Lane A LocalFile job of JSON files
with ``schema-changes.enabled``; a file with a new column (``age``) stops the reader, its
schema checkpoint completes through the master, the Jdbc sink's table gets the column, and the
file's rows land with it. The reader's restore (its worker killed) runs the new schema from its
checkpoint without a second change. A sink that cannot follow (LocalFile) fails the job with
the schema change's error naming the sink.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psycopg
import pytest

from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import TERMINAL, data_db, job, post, submit, wait_status
from tests.test_source_lane_a_cluster import empty_table, group, jdbc_sink

__all__ = ["data_db"]

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def evolving(db_template):
    """3 workers of 1 slot: the enumerator, the reader, and one to restore the reader onto."""
    c = Cluster(db_template, masters=1, workers=3, slots=1, heartbeat_timeout=3.0)
    c.env["KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS"] = "LocalFile"
    with c:
        yield c


class JsonInbox:
    def __init__(self, directory: Path) -> None:
        self.directory, self.files, self.rows = directory, 0, 0
        directory.mkdir()

    def drop(self, rows: int = 50, age: bool = False) -> None:
        """A new file of JSON lines (whole when it appears); with ``age`` a third column."""
        lines = [
            {"id": i, "name": f"n{i}", **({"age": i * 2} if age else {})}
            for i in range(self.rows, self.rows + rows)
        ]
        hidden = self.directory / f".part-{self.files}"
        hidden.write_text("".join(json.dumps(line) + "\n" for line in lines))
        os.rename(hidden, self.directory / f"in-{self.files:04d}.json")
        self.files, self.rows = self.files + 1, self.rows + rows


def job_config(inbox: JsonInbox, sink: str) -> str:
    return (
        "env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 300,"
        " job.retry.interval.seconds = 0, job.retry.times = 2 }\n"
        f'source {{ LocalFile {{ path = "{inbox.directory}", file_format_type = json,'
        " file.discovery.interval = 200, schema-changes.enabled = true,"
        " schema { fields { id = bigint, name = string } } } }\n"
        f"sink {{ {sink} }}\n"
    )


def table(url: str) -> tuple[list[str], list[tuple]]:
    with psycopg.connect(url) as conn:
        cur = conn.execute("SELECT * FROM lane_a ORDER BY id")
        return [c.name for c in cur.description], cur.fetchall()


def reader_poll(c: Cluster, job_id: int) -> dict:
    return (group(job(c, job_id), "READER").get("sourceRuntime") or {}).get("poll") or {}


def test_a_new_column_reaches_the_jdbc_table_and_survives_the_readers_restore(
    evolving, data_db, tmp_path
):
    evolving.restore()
    url = empty_table(data_db)
    inbox = JsonInbox(tmp_path / "inbox")
    inbox.drop()
    job_id = submit(evolving, job_config(inbox, jdbc_sink(url)))
    wait_for(lambda: len(table(data_db)[1]) == 50, 60, interval=0.2, what="the first file")

    inbox.drop(age=True)
    wait_for(lambda: len(table(data_db)[1]) == 100, 60, interval=0.2, what="the file with age")
    columns, rows = table(data_db)
    assert columns == ["id", "name", "age"]
    assert rows == [(i, f"n{i}", i * 2 if i >= 50 else None) for i in range(100)]
    wait_for(
        lambda: reader_poll(evolving, job_id).get("schemaChanges") == 1,
        30,
        what="the change in the reader's metrics",
    )
    assert job(evolving, job_id)["jobStatus"] == "RUNNING"

    detail = job(evolving, job_id)
    victim = group(detail, "READER")["member"]["name"]
    assert victim != group(detail, "ENUMERATOR")["member"]["name"]
    evolving.signal(victim, signal.SIGKILL)
    wait_for(
        lambda: (
            (d := job(evolving, job_id))["pipelines"][0]["restoreCount"] == 1
            and group(d, "READER")["status"] == "RUNNING"
        ),
        60,
        interval=0.1,
        what="the reader's restore",
    )
    inbox.drop(age=True)
    wait_for(lambda: len(table(data_db)[1]) == 150, 60, interval=0.2, what="a file after it")
    columns, rows = table(data_db)
    assert rows == [(i, f"n{i}", i * 2 if i >= 50 else None) for i in range(150)]
    assert group(job(evolving, job_id), "READER")["attempt"] == 2
    # Restored with the schema its checkpoint holds: no second change.
    # Restored with the schema its checkpoint holds: no second change (its metrics report
    # after the rows it wrote, at most a second later).
    wait_for(lambda: reader_poll(evolving, job_id).get("records", 0) >= 50, 30, what="its metrics")
    assert reader_poll(evolving, job_id)["schemaChanges"] == 0
    evolving.start(victim)
    assert post(evolving, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    assert wait_status(evolving, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"


def test_a_sink_that_cannot_follow_fails_the_job_naming_it(evolving, tmp_path):
    evolving.restore()
    inbox = JsonInbox(tmp_path / "inbox")
    inbox.drop(rows=5)
    out = tmp_path / "out"
    job_id = submit(
        evolving, job_config(inbox, f'LocalFile {{ path = "{out}", file_format_type = csv }}')
    )
    wait_status(evolving, job_id, {"RUNNING"}, timeout=30)
    inbox.drop(rows=5, age=True)
    detail = wait_status(evolving, job_id, TERMINAL, timeout=90)
    assert detail["jobStatus"] == "FAILED", detail
    assert "schema change failed" in detail["errorMsg"], detail["errorMsg"]
    assert "sink[0]" in detail["errorMsg"] and "age added" in detail["errorMsg"]
