"""The active master runs a due restore itself (no queue between the step and its deploy
commands), for a short budget each pass; the steps past that budget go to the control queue,
where the workers' pools run them. Commands are read from their real Celery queues on Redis."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django.db import DatabaseError

from engine.master import commands, control
from engine.models import ControlStep, Pipeline, TaskGroup
from engine.protocol import CONTROL_QUEUE, member_queue
from tests.brokerkit import take_commands
from tests.faultkit import refused

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


def test_restores_past_the_budget_go_to_the_control_queue(engine, monkeypatch):
    broker = redis.Redis.from_url(settings.REDIS_URL)
    jobs, _ = failed_pipelines(engine, 3)
    broker.delete(CONTROL_QUEUE)
    monkeypatch.setattr(control, "INLINE_BUDGET", 0.0)  # a storm: no time left in this pass

    assert control.enqueue_due_steps(engine.epoch)

    steps = list(ControlStep.objects.order_by("id"))
    assert [s.state for s in steps] == ["PENDING"] * 3  # claimed, for the workers
    assert commands.outbox.flush(5)
    assert tasks_on(broker, CONTROL_QUEUE) == sorted(
        ("engine.control.run", [s.id, engine.epoch]) for s in steps
    )
    # A worker's pool runs each (the same call as the control queue's task).
    assert [control.run_step(s.id, engine.epoch) for s in steps] == ["restored"] * 3
    assert set(Pipeline.objects.filter(job__in=jobs).values_list("status", flat=True)) == {
        "DEPLOYING"
    }


def test_a_database_error_in_a_restore_hands_it_and_the_rest_to_the_workers(engine):
    """The master cannot go on after a database error (it reconnects or steps down): the step
    it was running and the others it claimed go to the control queue at once, not after the
    re-enqueue timeout."""
    broker = redis.Redis.from_url(settings.REDIS_URL)
    jobs, _ = failed_pipelines(engine, 3)
    broker.delete(CONTROL_QUEUE)
    first = Pipeline.objects.get(job=jobs[0])
    # The first restore's pipeline update fails.
    with refused("engine_pipeline", "UPDATE", f"NEW.id = {first.id}"):
        with pytest.raises(DatabaseError):
            control.enqueue_due_steps(engine.epoch)
    steps = list(ControlStep.objects.order_by("id"))
    assert [s.state for s in steps] == ["PENDING"] * 3
    assert commands.outbox.flush(5)
    assert tasks_on(broker, CONTROL_QUEUE) == sorted(
        ("engine.control.run", [s.id, engine.epoch]) for s in steps
    )
