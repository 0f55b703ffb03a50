"""The active master runs a due restore itself (no queue between the step and its deploy
commands), for a short budget each pass; a step past that budget waits for the next pass, and
one due for longer than the hand-off goes to the control queue, where the workers' pools run
it. Commands are read from their real Celery queues on Redis."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models.functions import Now

from engine.master import commands, control
from engine.models import ControlStep, EngineEvent, Pipeline, TaskGroup
from engine.protocol import CONTROL_QUEUE, member_queue
from tests.brokerkit import take_commands
from tests.faultkit import refused
from tests.test_restore_slots import event_appends_held

pytestmark = pytest.mark.django_db(transaction=True)

JOB = """
env { job.mode = STREAMING, parallelism = 1, job.retry.interval.seconds = 0 }
source { FakeSource { rows.per-second = 10 } }
sink { Blackhole { } }
"""


def tasks_on(broker: redis.Redis, queue: str) -> list[tuple[str, list]]:
    """The commands waiting on ``queue`` (task name, args), consumed."""
    return sorted(take_commands(broker, queue))


def failed_pipelines(engine, jobs: int) -> tuple[list, object]:
    """``jobs`` jobs whose pipeline lost its member: each one's restore step is due."""
    first = engine.add_member(slots=2 * jobs)
    submitted = [engine.submit(config=JOB) for _ in range(jobs)]
    engine.schedule()
    engine.run_deployed()
    survivor = engine.add_member(slots=2 * jobs)
    engine.lose(first)
    engine.fail_lost()
    engine.stop_failing()
    assert ControlStep.objects.filter(state="PENDING").count() == jobs
    return submitted, survivor


def test_a_due_restore_runs_in_the_master_and_its_deploys_go_out_at_once(engine):
    broker = redis.Redis.from_url(settings.REDIS_URL)
    (job,), survivor = failed_pipelines(engine, 1)
    broker.delete(CONTROL_QUEUE, member_queue(survivor.name))

    assert control.enqueue_due_steps(engine.epoch)

    step = ControlStep.objects.get(job=job)
    assert (step.state, step.result, step.epoch) == ("DONE", "restored on 2 slots", engine.epoch)
    assert Pipeline.objects.get(job=job).status == "DEPLOYING"
    assert commands.outbox.flush(5)
    assert tasks_on(broker, CONTROL_QUEUE) == []  # nothing for a worker to run
    groups = TaskGroup.objects.filter(job=job).order_by("id")
    assert tasks_on(broker, member_queue(survivor.name)) == sorted(
        ("engine.taskgroup.deploy", [g.id, g.attempt, str(survivor.uuid)]) for g in groups
    )


def test_restores_past_the_budget_wait_for_the_next_pass(engine, monkeypatch):
    """A storm: no time left in this pass. Steps that have just become due are given back
    (claimed by nobody, nothing on the queue), and the next pass runs them in the master."""
    broker = redis.Redis.from_url(settings.REDIS_URL)
    jobs, _ = failed_pipelines(engine, 3)
    broker.delete(CONTROL_QUEUE)
    monkeypatch.setattr(control, "INLINE_BUDGET", 0.0)

    assert control.enqueue_due_steps(engine.epoch)

    steps = list(ControlStep.objects.order_by("id"))
    assert [(s.state, s.enqueued_at) for s in steps] == [("PENDING", None)] * 3
    assert commands.outbox.flush(5)
    assert tasks_on(broker, CONTROL_QUEUE) == []
    monkeypatch.setattr(control, "INLINE_BUDGET", 0.25)
    assert control.enqueue_due_steps(engine.epoch)
    assert set(ControlStep.objects.values_list("state", flat=True)) == {"DONE"}
    assert set(Pipeline.objects.filter(job__in=jobs).values_list("status", flat=True)) == {
        "DEPLOYING"
    }


def test_restores_due_for_longer_than_the_hand_off_go_to_the_control_queue(engine, monkeypatch):
    broker = redis.Redis.from_url(settings.REDIS_URL)
    jobs, _ = failed_pipelines(engine, 3)
    broker.delete(CONTROL_QUEUE)
    monkeypatch.setattr(control, "INLINE_BUDGET", 0.0)  # a storm: no time left in this pass
    ControlStep.objects.update(due_at=Now() - timedelta(seconds=control.HAND_OFF_AFTER + 1))

    assert control.enqueue_due_steps(engine.epoch)

    steps = list(ControlStep.objects.order_by("id"))
    assert [s.state for s in steps] == ["PENDING"] * 3  # claimed, for the workers
    assert all(s.enqueued_at is not None for s in steps)
    assert commands.outbox.flush(5)
    assert tasks_on(broker, CONTROL_QUEUE) == sorted(
        ("engine.control.run", [s.id, engine.epoch]) for s in steps
    )
    # A worker's pool runs each (the same call as the control queue's task).
    assert [control.run_step(s.id, engine.epoch) for s in steps] == ["restored"] * 3
    assert set(Pipeline.objects.filter(job__in=jobs).values_list("status", flat=True)) == {
        "DEPLOYING"
    }


def test_restores_run_in_the_master_share_a_transaction(engine):
    """A storm's restores are a few transactions of the master, not one each: three due steps
    commit together (one event-append turn), and their deploys go out after it."""
    broker = redis.Redis.from_url(settings.REDIS_URL)
    _, survivor = failed_pipelines(engine, 3)
    broker.delete(CONTROL_QUEUE, member_queue(survivor.name))
    after = EngineEvent.objects.order_by("-seq").values_list("seq", flat=True).first()

    assert control.enqueue_due_steps(engine.epoch)

    made = EngineEvent.objects.filter(seq__gt=after, kind="pipeline.restore")
    assert made.count() == 3
    assert len({at for at in made.values_list("at", flat=True)}) == 1  # one transaction's now()
    assert commands.outbox.flush(5)
    assert tasks_on(broker, CONTROL_QUEUE) == []
    assert len(tasks_on(broker, member_queue(survivor.name))) == 6


def test_a_restore_that_fails_in_the_master_goes_to_the_workers_and_the_others_restore(engine):
    """One restore's error (its savepoint rolls back) hands that step to the control queue at
    once, not after the re-enqueue timeout; the others of its transaction restore."""
    broker = redis.Redis.from_url(settings.REDIS_URL)
    jobs, _ = failed_pipelines(engine, 3)
    broker.delete(CONTROL_QUEUE)
    first = Pipeline.objects.get(job=jobs[0])
    with refused("engine_pipeline", "UPDATE", f"NEW.id = {first.id}"):
        assert control.enqueue_due_steps(engine.epoch)
    steps = {s.job_id: s for s in ControlStep.objects.all()}
    assert steps[jobs[0].id].state == "PENDING"
    assert [steps[j.id].state for j in jobs[1:]] == ["DONE", "DONE"]
    assert Pipeline.objects.get(id=first.id).status == "FAILING"
    assert commands.outbox.flush(5)
    assert tasks_on(broker, CONTROL_QUEUE) == [
        ("engine.control.run", [steps[jobs[0].id].id, engine.epoch])
    ]
    assert control.run_step(steps[jobs[0].id].id, engine.epoch) == "restored"


def test_a_database_error_of_the_transaction_hands_every_claimed_step_to_the_workers(engine):
    """The master cannot go on after an error of the whole transaction (here the event-append
    lock not taken within its lock timeout; it reconnects or steps down): the steps it was
    running and the others it claimed go to the control queue at once, and none of them
    restored."""
    broker = redis.Redis.from_url(settings.REDIS_URL)
    jobs, _ = failed_pipelines(engine, 3)
    broker.delete(CONTROL_QUEUE)
    with event_appends_held(), pytest.raises(DatabaseError):
        control.enqueue_due_steps(engine.epoch)
    steps = list(ControlStep.objects.order_by("id"))
    assert [s.state for s in steps] == ["PENDING"] * 3
    assert set(Pipeline.objects.filter(job__in=jobs).values_list("status", flat=True)) == {
        "FAILING"
    }
    assert commands.outbox.flush(5)
    assert tasks_on(broker, CONTROL_QUEUE) == sorted(
        ("engine.control.run", [s.id, engine.epoch]) for s in steps
    )


def test_a_restore_whose_job_another_transaction_holds_goes_to_the_workers(engine):
    """The master does not wait for a job row another transaction holds (a worker's report):
    that step goes to the control queue, where a worker waits for it, and the others of the
    chunk restore at once."""
    broker = redis.Redis.from_url(settings.REDIS_URL)
    jobs, _ = failed_pipelines(engine, 3)
    broker.delete(CONTROL_QUEUE)
    db = connection.settings_dict
    with psycopg.connect(
        dbname=db["NAME"], host=db["HOST"] or None, port=db["PORT"] or None
    ) as holder:
        holder.execute("SELECT id FROM engine_job WHERE id = %s FOR NO KEY UPDATE", (jobs[1].id,))
        assert control.enqueue_due_steps(engine.epoch)
        holder.rollback()
    steps = {s.job_id: s for s in ControlStep.objects.all()}
    assert [steps[j.id].state for j in jobs] == ["DONE", "PENDING", "DONE"]
    assert commands.outbox.flush(5)
    assert tasks_on(broker, CONTROL_QUEUE) == [
        ("engine.control.run", [steps[jobs[1].id].id, engine.epoch])
    ]
    assert control.run_step(steps[jobs[1].id].id, engine.epoch) == "restored"
