"""A worker's report commits, then the database blips before the answer reaches the worker: the
retry (engine.dbsession.ride_out) must find the report already made and answer as the first
call would have. Otherwise a task group whose RUNNING report was retried stops while its row
stays RUNNING with no thread behind it, and a reader whose ack was retried never learns its
final checkpoint."""

from __future__ import annotations

import pytest
from django.db import connection

from engine.dbsession import ride_out
from engine.jobs import checkpoints, lifecycle
from engine.models import Checkpoint, TaskCheckpoint, TaskGroup

pytestmark = pytest.mark.django_db(transaction=True)

JOB = """
env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 60000 }
source { FakeSource { } }
sink { Blackhole { } }
"""


def answer_lost_once(call):
    """Run ``call`` for real; the first time, end our own session right after it committed, so
    its answer is lost as in a blip (the driver raises, as for any dropped connection)."""
    lost = []

    def run():
        result = call()
        if not lost:
            lost.append(result)
            with connection.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return result

    return run, lost


def test_a_running_report_whose_answer_was_lost_is_answered_true_on_retry(engine):
    engine.add_member(slots=4)
    job = engine.submit(config=JOB)
    engine.schedule()
    group = TaskGroup.objects.get(job=job, kind="READER")
    assert group.status == "DEPLOYING"

    call, lost = answer_lost_once(
        lambda: lifecycle.mark_running(group.id, group.attempt, group.member_id)
    )
    assert ride_out(call, "reporting RUNNING", tolerance=10) is True
    assert lost == [True]  # the first call did commit: its answer was what got lost
    group.refresh_from_db()
    assert group.status == "RUNNING"
    # Not ours (another attempt) still answers False.
    assert not lifecycle.mark_running(group.id, group.attempt + 1, group.member_id)


def test_an_ack_whose_answer_was_lost_is_answered_true_even_once_the_checkpoint_ended(engine):
    engine.add_member(slots=4)
    job = engine.submit(config=JOB)
    engine.schedule()
    engine.run_deployed()
    groups = list(TaskGroup.objects.filter(job=job).order_by("id"))
    checkpoint = Checkpoint.objects.create(
        job_id=job.id,
        pipeline_id=groups[0].pipeline_id,
        expected={str(g.id): g.attempt for g in groups},
    )
    for group in groups[:-1]:
        assert checkpoints.acknowledge(checkpoint.id, group.id, group.attempt, {})
    last = groups[-1]
    snapshot = {"splits": {"0": {"offset": 5, "done": True}}, "sinks": []}

    def ack_then_complete():
        acked = checkpoints.acknowledge(checkpoint.id, last.id, last.attempt, snapshot)
        checkpoints.complete_or_expire(engine.epoch)  # the master completes it meanwhile
        return acked

    call, lost = answer_lost_once(ack_then_complete)
    assert ride_out(call, "acknowledging a barrier", tolerance=10) is True
    assert lost == [True]
    assert Checkpoint.objects.get(id=checkpoint.id).state == "COMPLETED"
    assert TaskCheckpoint.objects.get(checkpoint=checkpoint, task_group=last).state == snapshot
