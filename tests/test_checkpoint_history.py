"""A job's checkpoint history outlives its checkpoints' rows: each checkpoint is recorded as it
ends (completed, expired, or failed by the job's end), so the job page and
``GET /api/v1/jobs/<id>/checkpoints`` show the newest 100 whatever ``checkpoint.max-retained``
kept, and after the job's running-state cleanup; one statement records any number that end
together, and the history is bounded per job."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework import serializers
from rest_framework.test import APIClient

from engine.jobs import checkpoint_history, checkpoints, cleanup
from engine.models import (
    Checkpoint,
    CheckpointRecord,
    Job,
    JobCleanupRecord,
    Pipeline,
    TaskCheckpoint,
    TaskGroup,
)
from tests.conftest import role_user

pytestmark = pytest.mark.django_db(transaction=True)

JOB = """
env { job.mode = STREAMING, parallelism = 2, checkpoint.interval = 60000,
      checkpoint.max-retained = 3, checkpoint.timeout = 60000 }
source { FakeSource { } }
sink { Blackhole { } }
"""


@pytest.fixture
def viewer():
    client = APIClient()
    client.force_authenticate(role_user("watcher", "viewer"))
    return client


def running_job(engine) -> Job:
    if not engine.alive():
        engine.add_member(slots=8)
    job = engine.submit(config=JOB)
    engine.schedule()
    engine.run_deployed()
    return job


def trigger(job: Job) -> Checkpoint:
    groups = TaskGroup.objects.filter(job=job)
    return Checkpoint.objects.create(
        job=job,
        pipeline=Pipeline.objects.get(job=job),
        expected={str(g.id): g.attempt for g in groups},
    )


def ack(checkpoint: Checkpoint, only: int | None = None) -> None:
    """Every expected task group acks (or the first ``only``), each snapshot its own size."""
    for group_id, attempt in sorted(checkpoint.expected.items())[:only]:
        state = {"splits": {"s": checkpoint.id}, "pad": "x" * (int(group_id) % 50)}
        assert checkpoints.acknowledge(checkpoint.id, int(group_id), attempt, state)


def complete(engine, job: Job, n: int) -> list[int]:
    """n checkpoints of the job's pipeline, each completed by the master in turn."""
    ids = []
    for _ in range(n):
        checkpoint = trigger(job)
        ack(checkpoint)
        assert checkpoints.complete_or_expire(engine.epoch) == 1
        ids.append(checkpoint.id)
    return ids


def test_the_history_keeps_what_max_retained_pruned_with_sizes_and_acks(engine, viewer):
    job = running_job(engine)
    ids = complete(engine, job, 10)
    assert Checkpoint.objects.filter(job=job).count() == 3  # checkpoint.max-retained
    groups = sorted(TaskGroup.objects.filter(job=job).values_list("id", flat=True))

    history = checkpoint_history.recent(job.id)
    assert [c["checkpointId"] for c in history] == ids[::-1]  # newest first
    for row in history:
        assert row["state"] == "COMPLETED" and row["pipelineId"] == 1
        assert row["endedAt"] >= row["triggeredAt"] and row["durationMs"] >= 0
        assert [t["taskGroupId"] for t in row["tasks"]] == groups
        assert row["sizeBytes"] == sum(t["sizeBytes"] for t in row["tasks"]) > 0
        assert all(t["ackedAt"] >= row["triggeredAt"] for t in row["tasks"])

    # The API answers the same, its ack times as it wrote them from the acks' own rows.
    answered = viewer.get(f"/api/v1/jobs/{job.id}/checkpoints").json()
    assert [c["checkpointId"] for c in answered] == ids[::-1]
    as_written = serializers.DateTimeField().to_representation
    for row in answered[:3]:  # the retained ones still have their acks' rows
        acks = TaskCheckpoint.objects.filter(checkpoint_id=row["checkpointId"])
        stored = {a.task_group_id: (as_written(a.acked_at), a.size_bytes) for a in acks}
        assert {t["taskGroupId"]: (t["ackedAt"], t["sizeBytes"]) for t in row["tasks"]} == stored
        assert row["sizeBytes"] == sum(size for _, size in stored.values())


def test_the_history_outlives_the_jobs_running_state_and_goes_with_the_job(engine, viewer):
    job = running_job(engine)
    ids = complete(engine, job, 4)
    open_one = trigger(job)
    ack(open_one, only=1)
    pending = checkpoint_history.recent(job.id)[0]
    assert (pending["checkpointId"], pending["state"], pending["endedAt"]) == (
        open_one.id,
        "PENDING",
        None,
    )
    assert len(pending["tasks"]) == 1 and pending["sizeBytes"] == pending["tasks"][0]["sizeBytes"]

    engine.cancel(job)  # the job's end fails the open checkpoint, and records it
    job.refresh_from_db()
    assert job.status == "CANCELED"
    JobCleanupRecord.objects.filter(job_id=job.id).update(
        due_at=timezone.now() - timedelta(seconds=1)
    )
    record = JobCleanupRecord.objects.get(job_id=job.id, kind="JOB_STATE")
    assert cleanup.execute(record.id) == "done"
    assert not Checkpoint.objects.filter(job=job).exists()
    assert not TaskCheckpoint.objects.filter(checkpoint__job=job).exists()

    history = viewer.get(f"/api/v1/jobs/{job.id}/checkpoints").json()
    assert [c["checkpointId"] for c in history] == [open_one.id, *ids[::-1]]
    failed = history[0]
    assert (failed["state"], failed["failureReason"]) == ("FAILED", "job CANCELED before every ack")
    assert failed["endedAt"] and failed["durationMs"] >= 0 and len(failed["tasks"]) == 1
    assert {c["state"] for c in history[1:]} == {"COMPLETED"}

    Job.objects.filter(id=job.id).delete()  # history retention
    assert not CheckpointRecord.objects.filter(job_id=job.id).exists()


def test_an_expired_checkpoint_is_recorded_with_its_failure_reason(engine):
    job = running_job(engine)
    late = trigger(job)
    ack(late, only=1)
    Checkpoint.objects.filter(id=late.id).update(triggered_at=timezone.now() - timedelta(minutes=2))
    assert checkpoints.complete_or_expire(engine.epoch) == 1
    [row] = checkpoint_history.recent(job.id)
    assert (row["checkpointId"], row["state"], row["failureReason"]) == (
        late.id,
        "FAILED",
        "checkpoint timeout",
    )
    assert row["durationMs"] >= 120_000 and len(row["tasks"]) == 1 and row["sizeBytes"] > 0


def test_one_pass_records_any_number_in_the_same_statements_and_keeps_the_newest_hundred(
    engine,
):
    job, other = running_job(engine), running_job(engine)
    complete(engine, other, 2)

    def end_together(n: int) -> list[int]:
        made = [trigger(job) for _ in range(n)]
        TaskCheckpoint.objects.bulk_create(
            TaskCheckpoint(
                checkpoint=c, task_group_id=int(g), attempt=a, state={}, size_bytes=10 + int(g)
            )
            for c in made
            for g, a in c.expected.items()
        )
        with CaptureQueriesContext(connection) as captured:
            assert checkpoints.complete_or_expire(engine.epoch) == n
        # One INSERT ... SELECT and one DELETE of the history, however many ended.
        recording = [q["sql"].split()[0] for q in captured if "engine_checkpointrecord" in q["sql"]]
        assert recording == ["INSERT", "DELETE"]
        return [c.id for c in made]

    first = end_together(5)
    many = end_together(105)
    kept = CheckpointRecord.objects.filter(job=job).order_by("-checkpoint_id")
    assert list(kept.values_list("checkpoint_id", flat=True)) == (first + many)[::-1][:100]
    assert CheckpointRecord.objects.filter(job=other).count() == 2  # not this job's to prune
    newest = kept.first()
    groups = sorted(int(g) for g in Checkpoint.objects.get(id=many[-1]).expected)
    assert [t["taskGroupId"] for t in newest.tasks] == groups
    assert newest.size_bytes == sum(10 + g for g in groups)

    checkpoint_history.record(Checkpoint.objects.filter(job=job))  # again: nothing new
    assert CheckpointRecord.objects.filter(job=job).count() == 100

    pending = trigger(job)
    with CaptureQueriesContext(connection) as captured:
        history = checkpoint_history.recent(job.id)
    assert len(captured) == 1
    assert len(history) == 100 and history[0]["checkpointId"] == pending.id
    assert [c["checkpointId"] for c in history[1:]] == many[::-1][:99]


def test_the_migration_backfills_the_checkpoints_that_ended_before(engine):
    job = running_job(engine)
    complete(engine, job, 5)
    expired = trigger(job)
    Checkpoint.objects.filter(id=expired.id).update(
        triggered_at=timezone.now() - timedelta(minutes=2)
    )
    checkpoints.complete_or_expire(engine.epoch)
    trigger(job)  # pending: not recorded
    recorded = checkpoint_history.recent(job.id)
    retained = set(Checkpoint.objects.exclude(state="PENDING").values_list("id", flat=True))
    CheckpointRecord.objects.all().delete()

    migration = importlib.import_module("engine.migrations.0029_observability")
    with connection.cursor() as cur:
        cur.execute(migration.BACKFILL_CHECKPOINT_RECORDS)
    backfilled = checkpoint_history.recent(job.id)
    assert {c["checkpointId"] for c in backfilled[1:]} == retained  # the rows there were
    assert [c for c in recorded if c["checkpointId"] in retained or c["state"] == "PENDING"] == (
        backfilled
    )
