"""A Lane A reader task group whose poll call ignores its wakeup fails when it is cancelled and
the call has not returned within ``poll.cancellation-timeout``: reported FAILED with an error
naming the option, its slot freed and the worker's runtime rid of it, while the call's thread is
abandoned; when the call returns at last, whatever that thread reports is fenced by its attempt.

On real PostgreSQL in this process: the engine's own steps place the job (tests/enginekit.py),
and a real member runtime runs the reader's task group thread, the process's watchdog watching
it. The connector's managed reader is the double (tests/blocking_readers.py StuckReader)."""

from __future__ import annotations

import pytest

from engine.member.runtime import MemberRuntime
from engine.models import TaskGroup
from engine.sourceruntime.watchdog import CANCELLATION_OPTION
from engine.states import ExecutionStatus, TaskGroupKind
from tests.blocking_readers import STUCK_JOB as JOB
from tests.blocking_readers import stuck
from tests.clusterkit import wait_for

__all__ = ["stuck"]

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_cancelled_reader_stuck_in_poll_fails_by_the_timeout_and_frees_its_slot(
    engine, stuck, caplog
):
    member = engine.add_member(slots=2)
    job = engine.submit(config=JOB)
    engine.schedule()
    group = TaskGroup.objects.get(job=job, kind=TaskGroupKind.READER)
    assert group.pipeline.plan["sourceRuntime"]["lane"] == "A"
    assert group.status == ExecutionStatus.DEPLOYING and group.slot_id is not None
    runtime = MemberRuntime(engine.sessions[member.id])
    runtime.deploy(group.id, group.attempt)
    thread = runtime._thread(group.id)
    assert stuck.entered.wait(30), "the reader never polled"
    assert runtime.cancel(group.id, group.attempt) == "stopping"
    assert stuck.wakeups >= 1  # woken at once, and ignores it

    def failed() -> TaskGroup | None:
        row = TaskGroup.objects.get(id=group.id)
        return row if row.status == ExecutionStatus.FAILED else None

    row = wait_for(failed, 30, interval=0.05, what="the task group to fail")
    assert CANCELLATION_OPTION in row.error_msg and "PollStuck" in row.error_msg
    assert row.slot_id is None and row.attempt == group.attempt
    assert runtime.running() == [] and thread.is_alive()  # abandoned, still in its call
    stuck.release()  # the call returns at last: the thread ends, its own report fenced
    thread.join(30)
    assert not thread.is_alive()
    assert not [r for r in caplog.records if "crashed" in r.getMessage()]
    assert thread.managed.counters.received == 0  # its late rows never reached the sinks
    after = TaskGroup.objects.get(id=group.id)
    assert (after.status, after.error_msg, after.attempt) == (
        ExecutionStatus.FAILED,
        row.error_msg,
        group.attempt,
    )
