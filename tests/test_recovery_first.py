"""While a recovery is under way the active master triggers no new checkpoint (their barriers,
acks and endings cost more than the restores under many jobs), but checkpoints in flight still
end and commit, and none is held back longer than TRIGGER_DEFERRAL_LIMIT."""

from __future__ import annotations

import pytest
from django.db.models.functions import Now

from engine.jobs import checkpoints
from engine.jobs.submission import submit_job
from engine.master import commands, control, orchestration
from engine.master.loop import RECOVERY_QUIET, TRIGGER_DEFERRAL_LIMIT, RecoveryFirst
from engine.models import Checkpoint, ControlStep


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_checkpoints_wait_while_recovery_works_and_for_a_moment_after():
    clock = Clock()
    first = RecoveryFirst(clock)
    assert first.may_trigger()
    first.recovered_something()
    assert not first.may_trigger()
    clock.now += RECOVERY_QUIET - 0.01
    assert not first.may_trigger()
    clock.now += 0.02
    assert first.may_trigger()


def test_a_recovery_that_never_ends_still_lets_checkpoints_through():
    clock = Clock()
    first = RecoveryFirst(clock)
    allowed = []
    for _ in range(int(3 * TRIGGER_DEFERRAL_LIMIT / 0.1)):  # a pass every 0.1 s, all busy
        first.recovered_something()
        allowed.append(first.may_trigger())
        clock.now += 0.1
    assert 2 <= sum(allowed) <= 3  # about once per TRIGGER_DEFERRAL_LIMIT


@pytest.mark.django_db(transaction=True)
def test_held_back_the_master_still_ends_what_is_in_flight(engine):
    engine.add_member(slots=4)
    config = (
        "env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 1 }\n"
        "source { FakeSource { } }\nsink { Blackhole { } }"
    )
    job = submit_job(config)
    engine.schedule()
    engine.run_deployed()
    barriers = checkpoints.trigger_due(engine.epoch)
    for checkpoint_id, target in barriers:
        checkpoints.acknowledge(checkpoint_id, target.task_group_id, target.attempt, {})

    assert orchestration.coordinate_checkpoints(engine.epoch, trigger=False)
    assert commands.outbox.flush(5)
    assert list(Checkpoint.objects.filter(job=job).values_list("state", flat=True)) == [
        "COMPLETED"
    ]  # ended, and no new one although one is due
    assert orchestration.coordinate_checkpoints(engine.epoch, trigger=True)
    assert Checkpoint.objects.filter(job=job, state="PENDING").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_restore_waiting_for_slots_holds_no_checkpoint_back(engine):
    """A restore that finds too few slots stays due and is tried every second: that moves no
    recovery, so it must not keep every other job's checkpoints waiting."""
    hosts = [engine.add_member(slots=2) for _ in range(2)]
    engine.submit(threshold=2)
    engine.schedule()
    engine.run_deployed()
    engine.lose(hosts[0])
    engine.settle()  # one pipeline restored on the freed slots; the other waits for slots
    ControlStep.objects.filter(state="PENDING").update(due_at=Now())
    tried = ControlStep.objects.get(state="PENDING").attempts
    moved = []
    assert control.enqueue_due_steps(engine.epoch, lambda: moved.append(True))
    assert ControlStep.objects.get(state="PENDING").attempts == tried + 1  # tried, still waiting
    assert moved == []

    engine.add_member(slots=2)
    ControlStep.objects.filter(state="PENDING").update(due_at=Now(), enqueued_at=None)
    assert control.enqueue_due_steps(engine.epoch, lambda: moved.append(True))
    assert moved == [True]
    assert not ControlStep.objects.filter(state="PENDING").exists()
