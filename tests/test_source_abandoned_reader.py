"""A Lane A reader task group abandoned by the poll watchdog (its call ignored its wakeup past
``poll.cancellation-timeout``) gives back what it held while its thread is still in the call:
the watchdog forgets its watch, and the commands its mailbox held return their bytes to the
worker's mailbox budget (a later admission is refused by the terminal signal).

On real PostgreSQL in this process, as tests/test_source_cancellation_task_group.py: the
engine's own steps place the job, a real member runtime runs the reader's task group thread."""

from __future__ import annotations

import pytest

from engine.member.mailbox import Barrier
from engine.member.runtime import MemberRuntime
from engine.models import TaskGroup
from engine.sourceruntime.watchdog import watchdog
from engine.states import ExecutionStatus, TaskGroupKind
from tests.blocking_readers import STUCK_JOB as JOB
from tests.blocking_readers import stuck
from tests.clusterkit import wait_for

__all__ = ["stuck"]

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_abandoned_reader_releases_its_watch_and_its_mailbox_bytes(engine, stuck):
    member = engine.add_member(slots=2)
    job = engine.submit(config=JOB)
    engine.schedule()
    group = TaskGroup.objects.get(job=job, kind=TaskGroupKind.READER)
    runtime = MemberRuntime(engine.sessions[member.id])
    before = set(map(id, watchdog()._watches))
    runtime.deploy(group.id, group.attempt)
    thread = runtime._thread(group.id)
    assert stuck.entered.wait(30), "the reader never polled"
    [watch] = [w for w in watchdog()._watches if id(w) not in before]
    assert thread.managed.offer(Barrier(7))  # queued behind the stuck call
    assert runtime.budget.used > 0
    assert runtime.cancel(group.id, group.attempt) == "stopping"
    wait_for(
        lambda: TaskGroup.objects.get(id=group.id).status == ExecutionStatus.FAILED,
        30,
        interval=0.05,
        what="the task group to fail",
    )
    wait_for(lambda: watch not in watchdog()._watches, 5, interval=0.01, what="the watch gone")
    assert thread.is_alive()  # abandoned, still in its call
    assert runtime.budget.used == 0 and thread.managed.mailbox.commands == 0
    assert not thread.managed.offer(Barrier(8))  # refused: nothing more is held
    assert runtime.budget.used == 0
    stuck.release()  # its call returns: the thread ends, fenced, before the database is reset
    thread.join(30)
    assert not thread.is_alive()
