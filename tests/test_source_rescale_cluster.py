"""Rescale of a Lane A pipeline on a real cluster: a STREAMING LocalFile job into Jdbc (a table
without a key: duplicates show), checkpointing every 300 ms, rescaled 2 -> 3 and then 3 -> 1
through ``POST /api/v1/jobs/{id}/rescale`` while large files are partly read and partly
committed.

Each rescale restores the pipeline from its latest completed checkpoint at the new parallelism:
job detail shows the new readers (one attempt above the old readers' highest), the new
parallelism and the restore; the checkpoint restored from holds every split the old readers had
on exactly one new reader (the partly read files with their offsets); files dropped before,
during and after each rescale are all read, and every row is in the table exactly once (3 -> 1:
the sinks of the removed readers commit their share of the checkpoint once, by reader 0).
"""

from __future__ import annotations

import pytest

from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import TERMINAL, data_db, job, post, wait_status
from tests.test_source_lane_a_cluster import (
    HUGE_FILE,
    Inbox,
    committed,
    start_streaming_into_table,
)

__all__ = ["data_db"]

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def rescaling(db_template):
    """2 workers of 3 slots: room for an enumerator and 3 readers. Only LocalFile runs in Lane
    A here."""
    c = Cluster(db_template, masters=1, workers=2, slots=3, heartbeat_timeout=5.0)
    c.env["KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS"] = "LocalFile"
    with c:
        yield c


def readers(detail: dict) -> list[tuple[int, int, str]]:
    """(index, attempt, status) of the pipeline's readers."""
    groups = detail["pipelines"][0]["taskGroups"]
    return sorted((g["index"], g["attempt"], g["status"]) for g in groups if g["kind"] == "READER")


def restored_from(c: Cluster, job_id: int, restore: int) -> int:
    return c.one(
        "SELECT (payload->>'fromCheckpoint')::bigint FROM engine_engineevent WHERE job_id = %s"
        " AND kind = 'pipeline.restore' AND (payload->>'restore')::int = %s",
        (job_id, restore),
    )


def held_splits(c: Cluster, checkpoint_id: int) -> dict[int, dict[str, int]]:
    """Each reader's splits and offsets in the checkpoint, by reader index."""
    rows = c.query(
        "SELECT g.index, a.state::jsonb->'managed'->'state'->'offsets' FROM engine_taskcheckpoint a"
        " JOIN engine_taskgroup g ON g.id = a.task_group_id"
        " WHERE a.checkpoint_id = %s AND g.kind = 'READER'",
        (checkpoint_id,),
    )
    return {index: offsets or {} for index, offsets in rows}


def rescale_while_reading(c: Cluster, data_db: str, inbox: Inbox, job_id: int, to: int) -> None:
    """Two large files dropped, the rescale asked for once they are being committed, more files
    dropped while it runs."""
    before = inbox.rows
    for _ in range(2):
        inbox.drop(HUGE_FILE)
    wait_for(
        lambda: committed(data_db)[0] > before + 2000,
        60,
        interval=0.02,
        what="the large files being committed",
    )
    code, body = post(c, f"/api/v1/jobs/{job_id}/rescale", {"parallelism": to})
    assert code == 202, body
    for _ in range(3):  # dropped while the pipeline is being rescaled
        inbox.drop()


def test_a_lane_a_pipeline_rescales_up_and_down_exactly_once(rescaling, data_db, tmp_path):
    rescaling.restore()
    inbox = Inbox(tmp_path / "inbox")
    inbox.directory.mkdir()
    job_id = start_streaming_into_table(rescaling, data_db, inbox, retries=3)

    for restore, (to, attempt) in enumerate(((3, 2), (1, 3)), start=1):
        rescale_while_reading(rescaling, data_db, inbox, job_id, to)
        wait_for(
            lambda r=restore, n=to, a=attempt: (
                (d := job(rescaling, job_id))["pipelines"][0]["restoreCount"] == r
                and d["pipelines"][0]["status"] == "RUNNING"
                and readers(d) == [(i, a, "RUNNING") for i in range(n)]
            ),
            60,
            interval=0.2,
            what=f"the pipeline running with {to} readers",
        )
        detail = job(rescaling, job_id)
        pipeline = detail["pipelines"][0]
        assert (detail["jobStatus"], pipeline["status"], pipeline["parallelism"]) == (
            "RUNNING",
            "RUNNING",
            to,
        )
        assert detail["slotsNeeded"] == 1 + to
        # the checkpoint restored from, as the new readers found it: every split on one of them
        held = held_splits(rescaling, restored_from(rescaling, job_id, restore))
        assert sorted(held) == list(range(to))
        ids = [split for offsets in held.values() for split in offsets]
        assert len(ids) == len(set(ids)), held
        for _ in range(2):  # dropped after it
            inbox.drop()
        wait_for(
            lambda: committed(data_db) == (inbox.rows, inbox.rows),
            180,
            interval=0.5,
            what=f"all {inbox.files} files after the rescale to {to}",
        )

    step_results = rescaling.query(
        "SELECT result FROM engine_controlstep WHERE job_id = %s AND kind = 'rescale-pipeline'"
        " ORDER BY id",
        (job_id,),
    )
    assert [r[0].split(" on ")[0] for r in step_results] == [
        "rescaled from 2 to 3 readers",
        "rescaled from 3 to 1 readers",
    ]
    assert committed(data_db) == (inbox.rows, inbox.rows)  # every row, each once
    assert post(rescaling, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    assert wait_status(rescaling, job_id, TERMINAL, timeout=30)["jobStatus"] == "CANCELED"
