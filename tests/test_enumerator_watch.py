"""A member's idle enumerators ask the database in one statement, not two queries each, and the
master fails a member loss's task groups a few jobs a transaction, not one group each."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.db import connection

from engine.jobs import lifecycle
from engine.member.runtime import ENUMERATOR_CHECK_INTERVAL, EnumeratorWatch
from engine.models import TaskGroup
from engine.states import ExecutionStatus, TaskGroupKind

pytestmark = pytest.mark.django_db(transaction=True)


class Statements:
    """The statements this process sends while counting (Django's execute wrapper)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, execute, sql, params, many, context):
        self.sent.append(sql)
        return execute(sql, params, many, context)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def enumerators_of(member_id: int) -> list[TaskGroup]:
    return list(
        TaskGroup.objects.filter(member_id=member_id, kind=TaskGroupKind.ENUMERATOR).order_by("id")
    )


def test_one_statement_answers_every_enumerator_of_the_member(engine):
    member = engine.add_member(slots=16)
    jobs = [engine.submit() for _ in range(3)]
    engine.schedule()
    engine.run_deployed()
    groups = enumerators_of(member.id)
    assert len(groups) == 6  # two pipelines a job
    clock = Clock()
    watch = EnumeratorWatch(member.id, clock=clock)
    threads = [SimpleNamespace(task_group_id=g.id, attempt=g.attempt) for g in groups]
    for group in groups:
        watch.add(group.id, group.attempt, group.pipeline_id)

    counted = Statements()
    with connection.execute_wrapper(counted):
        answers = [watch.check(thread) for thread in threads]
    assert answers == [(True, True)] * 6
    assert len(counted.sent) == 1, counted.sent

    # The first job's first pipeline loses its reader; the second job's first enumerator ends.
    reader = TaskGroup.objects.get(pipeline_id=groups[0].pipeline_id, kind=TaskGroupKind.READER)
    assert lifecycle.finish_task_group(
        reader.id, reader.attempt, member.id, ExecutionStatus.CANCELED
    )
    ended = next(g for g in groups if g.job_id == jobs[1].id)
    assert lifecycle.finish_task_group(ended.id, ended.attempt, member.id, ExecutionStatus.CANCELED)

    # Within half an interval the answer stands; after it, one statement asks again for all.
    clock.now += ENUMERATOR_CHECK_INTERVAL / 4
    counted = Statements()
    with connection.execute_wrapper(counted):
        assert watch.check(threads[0]) == (True, True)
    assert counted.sent == []
    clock.now += ENUMERATOR_CHECK_INTERVAL
    with connection.execute_wrapper(counted):
        answers = {g.id: watch.check(t) for g, t in zip(groups, threads, strict=True)}
    assert len(counted.sent) == 1, counted.sent
    assert answers[groups[0].id] == (True, False)  # its pipeline has no live reader
    assert answers[ended.id][0] is False  # not this member's live attempt any more
    assert [answers[g.id] for g in groups if g.id not in (groups[0].id, ended.id)] == [
        (True, True)
    ] * 4


def test_a_member_loss_fails_its_task_groups_a_few_jobs_a_transaction(engine):
    lost = engine.add_member(slots=120)
    jobs = [engine.submit() for _ in range(30)]
    engine.schedule()
    engine.run_deployed()
    on_lost = TaskGroup.objects.filter(member_id=lost.id, status=ExecutionStatus.RUNNING)
    assert on_lost.count() == 4 * len(jobs)
    assert engine.lose(lost)

    counted = Statements()
    with connection.execute_wrapper(counted):
        engine.fail_lost()
    fences = [sql for sql in counted.sent if "FROM engine_masterlease" in sql]
    assert len(fences) == 2, f"{len(fences)} fenced transactions for {len(jobs)} jobs"
    assert (
        not TaskGroup.objects.filter(member_id=lost.id)
        .exclude(status=ExecutionStatus.FAILED)
        .exists()
    )
    assert set(TaskGroup.objects.filter(job__in=jobs).values_list("lost_member_id", flat=True)) == {
        lost.id
    }
