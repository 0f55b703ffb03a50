"""A job's exception history on real PostgreSQL: every task group attempt that ends FAILED is
recorded once (a worker's error and traceback, or the member whose loss failed it), the
failures a restore followed say so, only the newest 16 are kept per job, and
``GET /api/v1/jobs/<id>/exceptions`` answers them newest first to viewers."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from engine.jobs import exceptions, lifecycle
from engine.member.dataplane import PluginFailure
from engine.member.tracebacks import traceback_of
from engine.models import Job, JobException, TaskGroup
from tests.conftest import role_user

pytestmark = pytest.mark.django_db(transaction=True)

JOB = """
env { job.mode = STREAMING, parallelism = 1, job.retry.interval.seconds = 0 }
source { FakeSource { } }
sink { Blackhole { } }
"""
TRACE = (
    "Traceback (most recent call last):\n"
    '  File "sink.py", line 9, in write\n'
    "    connect('jdbc:postgresql://bob:pw-zq7@db:5432/x')\n"
    "ValueError: boom\n"
)


def running_job(engine, config: str = JOB, slots: int = 4):
    member = engine.add_member(slots=slots)
    job = engine.submit(config=config)
    engine.schedule()
    engine.run_deployed()
    return member, job


def test_a_workers_failure_report_records_its_error_traceback_member_and_attempt(engine):
    member, job = running_job(engine)
    reader = TaskGroup.objects.get(job=job, kind="READER")
    ending = (reader.id, reader.attempt, "FAILED", "sink/0: ValueError: boom", None, TRACE)
    assert lifecycle.finish_task_groups(member.id, [ending]) == {ending: True}

    failure = JobException.objects.get(job=job)
    assert (failure.task_group_id, failure.attempt) == (reader.id, reader.attempt)
    assert (failure.member_id, failure.member_name) == (member.id, member.name)
    assert failure.pipeline_index == reader.pipeline.index
    assert failure.error == "sink/0: ValueError: boom"
    assert "ValueError: boom" in failure.traceback and "bob:******@db" in failure.traceback
    assert "pw-zq7" not in failure.traceback  # a URL's password is never kept
    assert not failure.member_lost and not failure.caused_restore  # the job fails instead
    assert Job.objects.get(id=job.id).status == "FAILING"
    # Ended again (a retry whose answer was lost): not recorded twice.
    assert lifecycle.finish_task_groups(member.id, [ending]) == {ending: False}
    assert JobException.objects.filter(job=job).count() == 1
    (shown,) = exceptions.recent(job.id)
    assert shown["taskGroup"] == "reader 0" and shown["memberName"] == member.name
    assert shown["member"] == {"uuid": str(member.uuid), "name": member.name}


def test_a_plugins_traceback_is_its_own_errors_and_keeps_its_end():
    def plugin_code():
        raise ValueError("the plugin's own error")

    try:
        try:
            plugin_code()
        except ValueError as exc:
            raise PluginFailure("sink/0", exc) from exc
    except PluginFailure as failure:
        text = traceback_of(failure)
    assert "plugin_code" in text and text.endswith("ValueError: the plugin's own error\n")
    assert "PluginFailure" not in text
    long = exceptions.last_part("x" * 40_000 + "the end")
    assert len(long) == exceptions.TRACEBACK_LIMIT and long.endswith("the end")


def test_a_member_loss_records_each_lost_attempt_and_the_restore_marks_them(engine):
    lost, job = running_job(engine)
    engine.add_member(slots=4)  # room for the restore
    attempts = dict(TaskGroup.objects.filter(job=job).values_list("id", "attempt"))
    engine.lose(lost)
    with CaptureQueriesContext(connection) as captured:
        engine.fail_lost()
    sql = [q["sql"] for q in captured.captured_queries]
    # Both task groups ended in one call: one insert, one retention statement.
    assert sum("INSERT INTO engine_jobexception" in q for q in sql) == 1
    assert sum("DELETE FROM engine_jobexception" in q for q in sql) == 1

    failures = list(JobException.objects.filter(job=job).order_by("task_group_id"))
    assert {f.task_group_id: f.attempt for f in failures} == attempts
    for failure in failures:
        assert failure.member_lost and failure.member_id == lost.id
        assert failure.member_name == lost.name and lost.name in failure.error
        assert failure.traceback == ""
        # Every task group was on the lost member: the restore was requested in the same
        # transaction, and marked them.
        assert failure.caused_restore
    engine.settle()
    assert engine.running(job)


def test_a_loss_the_job_does_not_survive_caused_no_restore(engine):
    lost, job = running_job(
        engine, JOB.replace("parallelism = 1", "parallelism = 1, job.retry.times = 0")
    )
    engine.lose(lost)
    engine.fail_lost()
    assert Job.objects.get(id=job.id).status == "FAILED"
    failures = JobException.objects.filter(job=job)
    assert failures.count() == 2 and all(f.member_lost for f in failures)
    assert not any(f.caused_restore for f in failures)


def test_only_the_newest_16_failures_of_a_job_are_kept(engine):
    _, job = running_job(engine)
    _, other = running_job(engine)
    group = TaskGroup.objects.filter(job=job).first()

    def fail(job_id: int, group_id: int, attempts: range) -> None:
        exceptions.record(
            [exceptions.Failure(job_id, group_id, a, None, f"e{a}") for a in attempts]
        )

    fail(other.id, TaskGroup.objects.filter(job=other).first().id, range(3))
    fail(job.id, group.id, range(10))
    fail(job.id, group.id, range(10, 17))
    kept = list(JobException.objects.filter(job=job).values_list("attempt", flat=True))
    assert kept == list(range(16, 0, -1))  # newest first; attempt 0, the oldest, went
    assert JobException.objects.filter(job=other).count() == 3  # another job's stay
    assert [e["attempt"] for e in exceptions.recent(job.id)] == kept


def test_the_api_answers_viewers_newest_first_and_404_for_an_unknown_job(engine):
    member, job = running_job(engine)
    reader = TaskGroup.objects.get(job=job, kind="READER")
    ending = (reader.id, reader.attempt, "FAILED", "ValueError: boom", None, TRACE)
    lifecycle.finish_task_groups(member.id, [ending])
    path = f"/api/v1/jobs/{job.id}/exceptions"

    assert APIClient().get(path).status_code == 401
    nobody = APIClient()
    nobody.force_authenticate(get_user_model().objects.create_user("no-role"))
    assert nobody.get(path).status_code == 403
    viewer = APIClient()
    viewer.force_authenticate(role_user("watcher", "viewer"))
    assert viewer.get("/api/v1/jobs/999999/exceptions").status_code == 404
    response = viewer.get(path)
    assert response.status_code == 200
    (item,) = response.json()
    assert set(item) == {
        "exceptionId",
        "at",
        "pipelineId",
        "taskGroupId",
        "taskGroup",
        "attempt",
        "member",
        "memberName",
        "error",
        "traceback",
        "memberLost",
        "causedRestore",
    }
    assert item["taskGroupId"] == reader.id and item["taskGroup"] == "reader 0"
    assert item["attempt"] == reader.attempt and item["error"] == "ValueError: boom"
    assert item["member"] == {"uuid": str(member.uuid), "name": member.name}
    assert item["memberLost"] is False and item["causedRestore"] is False
    assert "pw-zq7" not in response.content.decode()
