"""A worker's reports, written together: RUNNING reports and endings of many task groups of
many jobs in one transaction answer each exactly as a report of its own would, and the group
commit that gathers them serves every thread that queued while a call ran with the next call."""

from __future__ import annotations

import threading

import pytest

from engine.jobs import lifecycle
from engine.jobs.cancel import cancel_job
from engine.member.reports import GroupCommit
from engine.models import EngineEvent, Job, Slot, TaskGroup
from tests.clusterkit import wait_for

JOB = """
env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 60000 }
source { FakeSource { } }
sink { Blackhole { } }
"""


@pytest.mark.django_db(transaction=True)
def test_reports_of_many_jobs_in_one_call_answer_as_each_alone(engine):
    member = engine.add_member(slots=16)
    jobs = [engine.submit(config=JOB) for _ in range(4)]
    engine.schedule()
    groups = list(TaskGroup.objects.filter(job__in=jobs).order_by("id"))
    assert len(groups) == 8 and {g.status for g in groups} == {"DEPLOYING"}
    first, canceled = jobs[0], jobs[3]
    already = next(g for g in groups if g.job_id == first.id)
    assert lifecycle.mark_running(already.id, already.attempt, member.id)
    cancel_job(canceled.id)
    stale = next(g for g in groups if g.job_id == jobs[1].id)

    keys = [(g.id, g.attempt) for g in groups if g.id != stale.id]
    keys.append((stale.id, stale.attempt + 1))  # an attempt that is not this one
    answers = lifecycle.mark_running_many(member.id, keys)

    for group in groups:
        group.refresh_from_db()
    for group in groups:
        if group.job_id == canceled.id:
            assert answers[(group.id, group.attempt)] is False
            assert group.status != "RUNNING"
        elif group.id == stale.id:
            assert answers[(stale.id, stale.attempt + 1)] is False
            assert group.status == "DEPLOYING"
        else:
            assert answers[(group.id, group.attempt)] is True  # the repeated one too
            assert group.status == "RUNNING"
    # One RUNNING event for each task group that started, and the jobs rolled up.
    running_events = EngineEvent.objects.filter(
        kind="taskgroup.status", payload__to="RUNNING"
    ).values_list("payload__taskGroupId", flat=True)
    started = [g.id for g in groups if g.status == "RUNNING"]
    assert sorted(running_events) == sorted(started)
    assert Job.objects.get(id=jobs[2].id).status == "RUNNING"
    assert lifecycle.mark_running_many(member.id, []) == {}


@pytest.mark.django_db(transaction=True)
def test_endings_of_many_jobs_in_one_call_answer_as_each_alone(engine):
    member = engine.add_member(slots=16)
    jobs = [engine.submit(config=JOB) for _ in range(3)]
    engine.schedule()
    engine.run_deployed()
    groups = {(g.job_id, g.kind): g for g in TaskGroup.objects.filter(job__in=jobs).order_by("id")}
    reader = groups[(jobs[0].id, "READER")]
    enumerator = groups[(jobs[1].id, "ENUMERATOR")]
    stale = groups[(jobs[2].id, "READER")]
    held = {g.id: g.slot_id for g in groups.values()}
    metrics = (40, 40, 20.0, 0.5, 0.25)
    endings = [
        (reader.id, reader.attempt, "CANCELED", "", metrics),
        (enumerator.id, enumerator.attempt, "CANCELED", "", None),
        (stale.id, stale.attempt + 1, "CANCELED", "", None),  # not this attempt
    ]
    answers = lifecycle.finish_task_groups(member.id, endings)
    assert answers == dict(zip(endings, [True, True, False], strict=True))
    for group in groups.values():
        group.refresh_from_db()
    assert (reader.status, reader.slot_id, reader.sink_written) == ("CANCELED", None, 40)
    assert (enumerator.status, enumerator.slot_id) == ("CANCELED", None)
    assert (stale.status, stale.slot_id) == ("RUNNING", held[stale.id])
    assert Slot.objects.get(id=held[reader.id]).state == "FREE"
    # Ended again (a retry whose answer was lost): nothing changes, as for a report alone.
    assert lifecycle.finish_task_groups(member.id, endings[:1]) == {endings[0]: False}
    assert EngineEvent.objects.filter(kind="taskgroup.status", payload__to="CANCELED").count() == 2
    assert lifecycle.finish_task_groups(member.id, []) == {}


def test_one_call_serves_every_report_queued_while_the_previous_one_ran():
    release = threading.Event()
    calls: list[list[int]] = []

    def run(keys: list[int]) -> dict[int, int]:
        calls.append(keys)
        if len(calls) == 1:
            release.wait(30)
        return {k: k * 10 for k in keys if k != 7}  # 7 gets the default

    commit = GroupCommit(run, default=-1)
    answers: dict[int, int] = {}

    def report(key: int) -> None:
        answers[key] = commit.commit(key)

    leader = threading.Thread(target=report, args=(0,))
    leader.start()
    wait_for(lambda: calls == [[0]], 10, interval=0.01, what="the first call")
    others = [threading.Thread(target=report, args=(k,)) for k in range(1, 20)]
    for thread in others:
        thread.start()
    wait_for(lambda: len(commit._queued) == 19, 10, interval=0.01, what="19 queued reports")
    release.set()
    for thread in [leader, *others]:
        thread.join(30)
    assert len(calls) == 2 and sorted(calls[1]) == list(range(1, 20))
    assert answers == {k: (-1 if k == 7 else k * 10) for k in range(20)}


def test_a_failed_call_fails_each_of_its_reports_and_the_next_call_runs():
    fail = threading.Event()
    fail.set()

    def run(keys: list[str]) -> dict[str, bool]:
        if fail.is_set():
            fail.clear()
            raise ConnectionError("the database went away")
        return dict.fromkeys(keys, True)

    commit = GroupCommit(run, default=False)
    with pytest.raises(ConnectionError):
        commit.commit("a")
    assert commit.commit("a") is True
    assert not commit._answers and not commit._queued and not commit._busy


def test_one_bad_report_fails_alone_and_the_others_of_its_call_are_written():
    release = threading.Event()
    calls: list[list[str]] = []

    def run(keys: list[str]) -> dict[str, bool]:
        calls.append(keys)
        if keys == ["first"]:
            release.wait(30)
        if "bad" in keys:
            raise ValueError("a report that cannot be written")
        return dict.fromkeys(keys, True)

    commit = GroupCommit(run, default=False)
    answers: dict[str, object] = {}

    def report(key: str) -> None:
        try:
            answers[key] = commit.commit(key)
        except ValueError as exc:
            answers[key] = exc

    threads = [threading.Thread(target=report, args=("first",))]
    threads[0].start()
    wait_for(lambda: calls == [["first"]], 10, interval=0.01, what="the first call")
    for key in ("a", "bad", "b"):
        threads.append(threading.Thread(target=report, args=(key,)))
        threads[-1].start()
    wait_for(lambda: len(commit._queued) == 3, 10, interval=0.01, what="3 queued reports")
    release.set()
    for thread in threads:
        thread.join(30)
    assert sorted(calls[1]) == ["a", "b", "bad"]  # together first, then each alone
    assert sorted(map(tuple, calls[2:])) == [("a",), ("b",), ("bad",)]
    assert answers["a"] is True and answers["b"] is True and answers["first"] is True
    assert isinstance(answers["bad"], ValueError)
