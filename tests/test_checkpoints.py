"""Checkpoint coordination rules on real PostgreSQL (no cluster): completion, timeout, supersede."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine.jobs import checkpoints
from engine.jobs.submission import submit_job
from engine.models import Checkpoint, ClusterState, MasterLease, Pipeline, TaskCheckpoint, TaskGroup

pytestmark = pytest.mark.django_db(transaction=True)
EPOCH = 7


@pytest.fixture
def running_pipeline():
    MasterLease.objects.update_or_create(id=1, defaults={"epoch": EPOCH, "holder": "m"})
    ClusterState.objects.get_or_create(id=1)
    job = submit_job(
        "env { job.mode = STREAMING, parallelism = 1, checkpoint.timeout = 500 }\n"
        "source { FakeSource { } }\nsink { Blackhole { } }"
    )
    job.status = "RUNNING"
    job.save()
    pipeline = Pipeline.objects.get(job=job)
    Pipeline.objects.filter(id=pipeline.id).update(status="RUNNING")
    TaskGroup.objects.filter(job=job).update(status="RUNNING", attempt=1)
    return Pipeline.objects.get(id=pipeline.id)


def start(pipeline: Pipeline, **extra) -> Checkpoint:
    groups = TaskGroup.objects.filter(pipeline=pipeline)
    return Checkpoint.objects.create(
        job_id=pipeline.job_id,
        pipeline=pipeline,
        expected={str(g.id): g.attempt for g in groups},
        **extra,
    )


def test_completes_when_every_expected_attempt_acked(running_pipeline):
    checkpoint = start(running_pipeline)
    groups = list(TaskGroup.objects.filter(pipeline=running_pipeline))
    assert checkpoints.acknowledge(checkpoint.id, groups[0].id, 1, {"kind": "enumerator"})
    assert not checkpoints.acknowledge(checkpoint.id, groups[0].id, 1, {})  # once per group
    checkpoints.complete_or_expire(EPOCH)
    assert Checkpoint.objects.get(id=checkpoint.id).state == "PENDING"
    checkpoints.acknowledge(checkpoint.id, groups[1].id, 1, {"splits": {}, "sinks": [{}]})
    checkpoints.complete_or_expire(EPOCH)
    assert Checkpoint.objects.get(id=checkpoint.id).state == "COMPLETED"
    assert Pipeline.objects.get(id=running_pipeline.id).checkpoints_completed == 1
    assert checkpoints.own_state(checkpoint.id, groups[1].id, 1) == {"splits": {}, "sinks": [{}]}
    assert checkpoints.own_state(checkpoint.id, groups[1].id, 2) is None  # another attempt


def test_times_out_after_checkpoint_timeout(running_pipeline):
    late = start(running_pipeline)
    Checkpoint.objects.filter(id=late.id).update(triggered_at=timezone.now() - timedelta(seconds=1))
    checkpoints.complete_or_expire(EPOCH)
    ended = Checkpoint.objects.get(id=late.id)
    assert (ended.state, ended.failure_reason) == ("FAILED", "checkpoint timeout")
    assert Pipeline.objects.get(id=running_pipeline.id).checkpoints_failed == 1


def test_fails_when_a_task_group_was_redeployed(running_pipeline):
    checkpoint = start(running_pipeline)
    TaskGroup.objects.filter(pipeline=running_pipeline).update(attempt=2)
    checkpoints.complete_or_expire(EPOCH)
    assert Checkpoint.objects.get(id=checkpoint.id).state == "FAILED"
    assert not TaskCheckpoint.objects.exists()


def test_ids_grow_and_retention_keeps_the_newest(running_pipeline):
    ids = []
    for _ in range(5):
        checkpoint = start(running_pipeline)
        for group in TaskGroup.objects.filter(pipeline=running_pipeline):
            checkpoints.acknowledge(checkpoint.id, group.id, 1, {})
        checkpoints.complete_or_expire(EPOCH)
        ids.append(checkpoint.id)
    assert ids == sorted(ids) and len(set(ids)) == 5
    kept = list(Checkpoint.objects.filter(pipeline=running_pipeline).values_list("id", flat=True))
    assert sorted(kept) == ids[-3:]  # checkpoint.max-retained = 3
    assert Pipeline.objects.get(id=running_pipeline.id).checkpoints_completed == 5
    assert checkpoints.latest_completed(running_pipeline.id).id == ids[-1]
