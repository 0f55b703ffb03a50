"""A restore and the completion of a checkpoint it races: the restore (a Celery control step,
in another process than the master) rewinds the readers to the newest completed checkpoint it
can see, and the new readers commit the one they find newest. If a checkpoint whose acks were
all in completed in between, the two differ: the sinks commit that checkpoint's data while the
readers re-read it from the older one (duplicates). Both take the pipeline's row lock: either
the completion comes first and the restore starts from it, or the restore does and the
checkpoint FAILS (its attempts were replaced)."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection, connections

from engine.jobs import checkpoints
from engine.models import Checkpoint, EngineEvent, Pipeline, TaskGroup
from tests.clusterkit import admin_conn, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

JOB = """
env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 60000,
      job.retry.interval.seconds = 0 }
source { FakeSource { } }
sink { Blackhole { } }
"""


def checkpoint_all_acked(pipeline: Pipeline) -> Checkpoint:
    groups = list(TaskGroup.objects.filter(pipeline=pipeline))
    checkpoint = Checkpoint.objects.create(
        job_id=pipeline.job_id, pipeline=pipeline, expected={str(g.id): g.attempt for g in groups}
    )
    for group in groups:
        assert checkpoints.acknowledge(checkpoint.id, group.id, group.attempt, {"splits": {}})
    return checkpoint


def in_thread(call, outcome: dict, key: str) -> threading.Thread:
    def run():
        try:
            outcome[key] = call()
        except BaseException as exc:
            outcome[key] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_restore_starts_from_the_checkpoint_its_new_readers_commit(engine):
    first = engine.add_member(slots=4)
    job = engine.submit(config=JOB)
    engine.schedule()
    engine.run_deployed()
    pipeline = Pipeline.objects.get(job=job)
    older = checkpoint_all_acked(pipeline)
    checkpoints.complete_or_expire(engine.epoch)
    assert Checkpoint.objects.get(id=older.id).state == "COMPLETED"
    racing = checkpoint_all_acked(pipeline)  # every ack in: the next tick completes it

    engine.add_member(slots=4)
    engine.lose(first)
    engine.fail_lost()
    engine.stop_failing()  # FAILING, every task group ended: the restore step is due
    assert Checkpoint.objects.get(id=racing.id).state == "PENDING"

    db = connection.settings_dict
    holder = psycopg.connect(dbname=db["NAME"], host=db["HOST"] or None, port=db["PORT"] or None)
    admin = admin_conn()

    def waiting() -> int:
        return admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
            (db["NAME"],),
        ).fetchone()[0]

    outcome: dict = {}
    try:
        # Hold the pipeline row so both queue behind it: the restore first, then the master.
        holder.execute(
            "SELECT 1 FROM engine_pipeline WHERE id = %s FOR NO KEY UPDATE", (pipeline.id,)
        )
        restore = in_thread(engine.restore_due, outcome, "restore")
        wait_for(lambda: waiting() >= 1, 5, interval=0.002, what="the restore to queue")
        # The master does not queue behind a pipeline another transaction holds: it leaves
        # its checkpoints to the next pass (it could deadlock with a job's ending otherwise).
        assert checkpoints.complete_or_expire(engine.epoch) == 0
        assert Checkpoint.objects.get(id=racing.id).state == "PENDING"
        holder.rollback()
        restore.join(10)
    finally:
        holder.close()
        admin.close()
    assert outcome["restore"] == ["restored"], outcome
    assert checkpoints.complete_or_expire(engine.epoch) == 1  # the master's next pass
    restored_from = (
        EngineEvent.objects.filter(job_id=job.id, kind="pipeline.restore")
        .order_by("-seq")
        .values_list("payload", flat=True)
        .first()["fromCheckpoint"]
    )
    assert restored_from == checkpoints.latest_completed(pipeline.id).id == older.id
    ended = Checkpoint.objects.get(id=racing.id)
    assert (ended.state, ended.failure_reason) == (
        "FAILED",
        "a task group was redeployed before every ack",
    )
