"""Checkpoint coordination rules on real PostgreSQL (no cluster): completion, timeout, supersede,
and the commits of completed checkpoints."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from engine.jobs import checkpoints
from engine.jobs.submission import submit_job
from engine.master import commands, orchestration
from engine.models import Checkpoint, ClusterState, MasterLease, Pipeline, TaskCheckpoint, TaskGroup
from engine.protocol import TASK_COMMIT, member_queue
from tests.brokerkit import take_commands
from tests.faultkit import refused

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


def test_an_ack_for_a_checkpoint_that_ended_is_not_recorded(running_pipeline):
    checkpoint = start(running_pipeline, state="FAILED")
    group = TaskGroup.objects.filter(pipeline=running_pipeline).first()
    assert not checkpoints.acknowledge(checkpoint.id, group.id, group.attempt, {})
    assert not TaskCheckpoint.objects.filter(checkpoint=checkpoint).exists()


def test_completes_when_every_expected_attempt_acked(running_pipeline):
    checkpoint = start(running_pipeline)
    groups = list(TaskGroup.objects.filter(pipeline=running_pipeline))
    assert checkpoints.acknowledge(checkpoint.id, groups[0].id, 1, {"kind": "enumerator"})
    # Once per group: the same attempt again is recorded already; another attempt is refused.
    assert checkpoints.acknowledge(checkpoint.id, groups[0].id, 1, {})
    assert not checkpoints.acknowledge(checkpoint.id, groups[0].id, 2, {})
    assert TaskCheckpoint.objects.get(checkpoint=checkpoint, task_group=groups[0]).state == {
        "kind": "enumerator"
    }
    checkpoints.complete_or_expire(EPOCH)
    assert Checkpoint.objects.get(id=checkpoint.id).state == "PENDING"
    checkpoints.acknowledge(checkpoint.id, groups[1].id, 1, {"splits": {}, "sinks": [{}]})
    checkpoints.complete_or_expire(EPOCH)
    assert Checkpoint.objects.get(id=checkpoint.id).state == "COMPLETED"
    assert Pipeline.objects.get(id=running_pipeline.id).checkpoints_completed == 1
    assert checkpoints.completed_since(groups[1].id, 1, 0) == (
        checkpoint.id,
        {"splits": {}, "sinks": [{}]},
    )
    assert checkpoints.completed_since(groups[1].id, 1, checkpoint.id) is None  # committed
    assert checkpoints.completed_since(groups[1].id, 2, 0) is None  # another attempt


def test_the_master_skips_a_pipeline_another_transaction_holds_instead_of_waiting(
    running_pipeline,
):
    """A job's ending transaction saves one pipeline and then locks the job's pipelines in id
    order; a master that waited for pipelines while holding others would deadlock with it.
    It skips a held pipeline (its checkpoint ends next pass) and never waits."""
    checkpoint = start(running_pipeline)
    for group in TaskGroup.objects.filter(pipeline=running_pipeline):
        assert checkpoints.acknowledge(checkpoint.id, group.id, 1, {})
    db = connection.settings_dict
    with psycopg.connect(
        dbname=db["NAME"], host=db["HOST"] or None, port=db["PORT"] or None
    ) as holder:
        holder.execute(
            "SELECT 1 FROM engine_pipeline WHERE id = %s FOR NO KEY UPDATE", (running_pipeline.id,)
        )
        with connection.cursor() as cur:
            cur.execute("SET lock_timeout = '3s'")  # without the skip: a lock timeout
        try:
            assert checkpoints.complete_or_expire(EPOCH) == 0
        finally:
            with connection.cursor() as cur:
                cur.execute("RESET lock_timeout")
        assert Checkpoint.objects.get(id=checkpoint.id).state == "PENDING"
    assert checkpoints.complete_or_expire(EPOCH) == 1
    assert Checkpoint.objects.get(id=checkpoint.id).state == "COMPLETED"


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


def test_no_checkpoint_completes_without_its_commit_when_ending_them_fails(engine):
    """The master ends the checkpoints that can end in one transaction, and sends the commits
    of the completed ones once it has committed: if ending them fails (a takeover, a database
    error), none is COMPLETED and no commit goes out, and the next pass completes them all and
    sends every commit (a COMPLETED checkpoint whose commit was never sent would wait for the
    next one: the new master only looks at PENDING checkpoints). The commands go to the
    members' real Celery queues on Redis."""
    member = engine.add_member(slots=4)
    job = submit_job(
        "env { job.mode = STREAMING, parallelism = 1 }\nsource { FakeSource { } }\n"
        "sink { Blackhole { } }"
    )
    engine.schedule()
    engine.run_deployed()
    pipeline = Pipeline.objects.get(job=job)
    reader = TaskGroup.objects.get(job=job, kind="READER")
    both = [start(pipeline), start(pipeline)]
    for checkpoint in both:
        for group in TaskGroup.objects.filter(pipeline=pipeline):
            checkpoints.acknowledge(checkpoint.id, group.id, group.attempt, {})
    broker = redis.Redis.from_url(settings.REDIS_URL)
    queue = member_queue(member.name)
    broker.delete(queue)
    # Ending the second one fails, after the first was ended in the same transaction.
    with (
        refused(
            "engine_checkpoint",
            "UPDATE",
            "EXISTS (SELECT 1 FROM engine_checkpoint WHERE state <> 'PENDING')",
        ),
        pytest.raises(DatabaseError),
    ):
        orchestration.coordinate_checkpoints(engine.epoch)
    assert commands.outbox.flush(5)
    states = dict(Checkpoint.objects.filter(pipeline=pipeline).values_list("id", "state"))
    assert sorted(states.values()) == ["PENDING", "PENDING"]
    assert broker.lrange(queue, 0, -1) == []  # nothing completed: nothing to commit

    assert orchestration.coordinate_checkpoints(engine.epoch)
    assert commands.outbox.flush(5)
    states = dict(Checkpoint.objects.filter(pipeline=pipeline).values_list("id", "state"))
    assert sorted(states.values()) == ["COMPLETED", "COMPLETED"]
    commits = [
        args for task, args in take_commands(broker, queue) if task == "engine.checkpoint.commit"
    ]
    assert sorted(commits) == sorted(
        [reader.id, reader.attempt, str(member.uuid), checkpoint.id] for checkpoint in both
    )


def test_a_failed_final_checkpoint_is_tried_again_within_seconds_not_an_interval(engine):
    """A batch reader that read all its input waits for a checkpoint triggered after that to
    complete before it ends: if that one fails, the next is due after FINAL_RETRY, not after
    ``checkpoint.interval`` (a minute here)."""
    engine.add_member(slots=4)
    job = submit_job(
        "env { job.mode = BATCH, parallelism = 1, checkpoint.interval = 60000 }\n"
        "source { FakeSource { } }\nsink { Blackhole { } }"
    )
    engine.schedule()
    engine.run_deployed()
    pipeline = Pipeline.objects.get(job=job)
    reader = TaskGroup.objects.get(pipeline=pipeline, kind="READER")
    now = checkpoints.database_now()
    TaskGroup.objects.filter(id=reader.id).update(input_ended_at=now - timedelta(seconds=5))
    earlier = start(pipeline, state="COMPLETED", triggered_at=now - timedelta(seconds=9))
    final = start(pipeline, state="FAILED", triggered_at=now - timedelta(seconds=4))

    due = checkpoints.trigger_due(engine.epoch)
    assert {checkpoint_id for checkpoint_id, _ in due} - {earlier.id, final.id}
    assert {target.task_group_id for _, target in due} == set(
        TaskGroup.objects.filter(pipeline=pipeline).values_list("id", flat=True)
    )

    # Once one triggered after the input ended completes, nothing more is owed before the
    # interval; a failed one just now is retried only after FINAL_RETRY.
    Checkpoint.objects.filter(state="PENDING").update(
        state="COMPLETED", triggered_at=now - timedelta(seconds=2)
    )
    assert checkpoints.trigger_due(engine.epoch) == []
    Checkpoint.objects.filter(state="COMPLETED").update(triggered_at=now - timedelta(seconds=9))
    start(pipeline, state="FAILED", triggered_at=checkpoints.database_now())
    assert checkpoints.trigger_due(engine.epoch) == []


def test_ending_checkpoints_and_sending_their_commits_costs_the_same_for_many(engine):
    """Under a hundred streaming jobs the master completes dozens of checkpoints a pass: the
    statements to end them and find their readers do not grow with their number (a query per
    checkpoint made a pass last seconds), and every reader gets its commit."""
    member = engine.add_member(slots=16)
    broker = redis.Redis.from_url(settings.REDIS_URL)
    queue = member_queue(member.name)

    def send_commits(completed: list[Checkpoint]) -> None:  # as the master's step does
        for checkpoint_id, target in checkpoints.committers(completed):
            commands.commit(target, checkpoint_id)

    def complete(jobs: int) -> tuple[int, list[list]]:
        """``jobs`` new jobs' checkpoints, acked and completed: (statements, commits sent)."""
        for _ in range(jobs):
            submit_job(
                "env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 60000 }\n"
                "source { FakeSource { } }\nsink { Blackhole { } }"
            )
            engine.schedule()
        engine.run_deployed()
        barriers = checkpoints.trigger_due(engine.epoch)
        assert len({checkpoint_id for checkpoint_id, _ in barriers}) == jobs
        for checkpoint_id, target in barriers:
            checkpoints.acknowledge(checkpoint_id, target.task_group_id, target.attempt, {})
        assert commands.outbox.flush(5)
        broker.delete(queue)
        with CaptureQueriesContext(connection) as queries:
            assert checkpoints.complete_or_expire(engine.epoch, send_commits) == jobs
        assert commands.outbox.flush(5)
        commits = [args for task, args in take_commands(broker, queue) if task == TASK_COMMIT]
        return len(queries), commits

    one, _ = complete(1)
    many, commits = complete(6)
    assert many == one
    newest = TaskGroup.objects.filter(kind="READER").order_by("-id")[:6]
    assert sorted(args[0] for args in commits) == sorted(g.id for g in newest)
