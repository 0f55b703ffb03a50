"""A checkpoint's size and its task groups' acks: each ack records the bytes its snapshot takes
as stored, and ``GET /api/v1/jobs/<id>/checkpoints`` answers every checkpoint with its size and
acks in a number of queries that does not grow with the checkpoints."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from engine.jobs import checkpoint_history, checkpoints
from engine.jobs.submission import submit_job
from engine.models import Checkpoint, Pipeline, TaskGroup
from tests.conftest import role_user

pytestmark = pytest.mark.django_db

READER_STATE = {"splits": {"fake-0": 41}, "sinks": [{"file": "out/é-€-part-0.csv"}]}


@pytest.fixture
def pipeline():
    job = submit_job(
        "env { job.mode = STREAMING, parallelism = 1 }\nsource { FakeSource { } }\n"
        "sink { Blackhole { } }"
    )
    Pipeline.objects.filter(job=job).update(status="RUNNING")
    TaskGroup.objects.filter(job=job).update(status="RUNNING", attempt=1)
    return Pipeline.objects.get(job=job)


@pytest.fixture
def viewer():
    client = APIClient()
    client.force_authenticate(role_user("watcher", "viewer"))
    return client


def checkpoint_acked_by_all(pipeline: Pipeline) -> Checkpoint:
    groups = TaskGroup.objects.filter(pipeline=pipeline).order_by("-id")  # acks out of order
    checkpoint = Checkpoint.objects.create(
        job_id=pipeline.job_id, pipeline=pipeline, expected={str(g.id): 1 for g in groups}
    )
    for group in groups:
        state = READER_STATE if group.kind == "READER" else {"kind": "enumerator"}
        assert checkpoints.acknowledge(checkpoint.id, group.id, 1, state)
    return checkpoint


def test_an_ack_records_the_utf8_bytes_of_its_snapshot_as_stored(pipeline):
    checkpoint = checkpoint_acked_by_all(pipeline)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT state, size_bytes FROM engine_taskcheckpoint WHERE checkpoint_id = %s",
            [checkpoint.id],
        )
        rows = cur.fetchall()
    assert len(rows) == 2
    for text, size in rows:
        assert size == len(text.encode("utf-8")) > 0
    assert sorted(size for _, size in rows) == sorted(
        len(json.dumps(state).encode()) for state in (READER_STATE, {"kind": "enumerator"})
    )


def test_the_api_answers_each_checkpoints_size_and_acks(pipeline, viewer):
    checkpoint = checkpoint_acked_by_all(pipeline)
    Checkpoint.objects.create(job_id=pipeline.job_id, pipeline=pipeline)  # none acked yet
    response = viewer.get(f"/api/v1/jobs/{pipeline.job_id}/checkpoints")
    assert response.status_code == 200
    newest, acked = response.json()
    assert newest["tasks"] == [] and newest["sizeBytes"] == 0
    assert acked["checkpointId"] == checkpoint.id and acked["pipelineId"] == pipeline.index
    assert acked["state"] == "PENDING" and acked["endedAt"] is None and acked["durationMs"] is None
    groups = sorted(TaskGroup.objects.filter(pipeline=pipeline).values_list("id", flat=True))
    assert [t["taskGroupId"] for t in acked["tasks"]] == groups
    stored = dict(
        checkpoint.acks.values_list("task_group_id", "size_bytes")  # the sizes as recorded
    )
    assert {t["taskGroupId"]: t["sizeBytes"] for t in acked["tasks"]} == stored
    assert acked["sizeBytes"] == sum(stored.values())
    assert all(t["ackedAt"] for t in acked["tasks"])
    # The job page reads the same dicts.
    assert [set(c) for c in checkpoint_history.recent(pipeline.job_id)] == [
        set(newest),
        set(acked),
    ]


def test_the_api_reads_any_number_of_checkpoints_in_the_same_few_queries(pipeline, viewer):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert viewer.get(f"/api/v1/jobs/{pipeline.job_id}/checkpoints").status_code == 200
        return len(captured)

    checkpoint_acked_by_all(pipeline)
    queries()  # the first request also reads the user's permissions
    one = queries()
    for _ in range(5):
        checkpoint_acked_by_all(pipeline)
    assert len(viewer.get(f"/api/v1/jobs/{pipeline.job_id}/checkpoints").json()) == 6
    assert queries() == one <= 3  # the job, its checkpoints, their acks
