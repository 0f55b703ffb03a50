"""``GET /api/v1/jobs/<id>/logs``: a job's task log lines, filtered by task group and level,
newest last, paged forward with ``after``; bad parameters are 400s naming them; viewers only."""

from __future__ import annotations

import datetime
import logging

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from engine.jobs import tasklog_reading
from engine.jobs.submission import submit_job
from engine.models import TaskGroup, TaskLogLine
from tests.conftest import role_user

CONFIG = """
env { job.mode = BATCH, parallelism = 2 }
source { FakeSource { row.num = 3, schema { fields { id = bigint } } } }
sink { Console { } }
"""
AT = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture
def viewer(db) -> APIClient:
    client = APIClient()
    client.force_authenticate(role_user("vera", "viewer"))
    return client


@pytest.fixture
def logged(db):
    """Two jobs; the first's three task groups wrote lines of every level, the second's one."""
    job, other = submit_job(CONFIG), submit_job(CONFIG)
    groups = list(TaskGroup.objects.filter(job=job).order_by("id"))
    levels = [logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL]
    lines = [
        TaskLogLine(
            job=job,
            task_group_id=group.id,
            attempt=1,
            at=AT + datetime.timedelta(seconds=n),
            level=levels[n % len(levels)],
            logger="keel.sink.console",
            message=f"{group.index}:{n}",
        )
        for n in range(10)
        for group in groups
    ]
    other_group = TaskGroup.objects.filter(job=other).first()
    lines.append(
        TaskLogLine(
            job=other, task_group_id=other_group.id, attempt=1, at=AT, level=20, message="other"
        )
    )
    TaskLogLine.objects.bulk_create(lines)
    return job, groups, other_group


def get(client: APIClient, job_id: int, **params):
    return client.get(f"/api/v1/jobs/{job_id}/logs", params)


def test_the_newest_lines_of_the_job_oldest_first(viewer, logged):
    job, _, _ = logged
    body = get(viewer, job.id).json()
    results = body["results"]
    assert len(results) == 30 and "other" not in {r["message"] for r in results}
    ids = [r["lineId"] for r in results]
    assert ids == sorted(ids) and body["nextAfter"] == ids[-1]
    first = results[0]
    assert set(first) == {
        "lineId",
        "at",
        "taskGroupId",
        "attempt",
        "level",
        "logger",
        "message",
    }
    assert (first["level"], first["logger"], first["attempt"]) == (
        "DEBUG",
        "keel.sink.console",
        1,
    )
    assert first["at"].startswith("2025-01-01T00:00:00")
    newest = get(viewer, job.id, limit=4).json()["results"]
    assert [r["lineId"] for r in newest] == ids[-4:]


def test_filters_by_task_group_and_minimum_level(viewer, logged):
    job, groups, _ = logged
    reader = groups[1]
    results = get(viewer, job.id, taskGroup=reader.id).json()["results"]
    assert {r["taskGroupId"] for r in results} == {reader.id} and len(results) == 10
    for level in ("warning", "WARNING", "30"):
        results = get(viewer, job.id, taskGroup=reader.id, level=level).json()["results"]
        assert [r["level"] for r in results] == ["WARNING", "ERROR", "CRITICAL"] * 2
    assert len(get(viewer, job.id, level="critical").json()["results"]) == 6


def test_after_pages_forward_for_a_polling_client(viewer, logged):
    job, _, _ = logged
    ids = [r["lineId"] for r in get(viewer, job.id).json()["results"]]
    page = get(viewer, job.id, after=ids[4], limit=5).json()
    assert [r["lineId"] for r in page["results"]] == ids[5:10]
    assert page["nextAfter"] == ids[9]
    done = get(viewer, job.id, after=ids[-1]).json()
    assert done == {"results": [], "nextAfter": ids[-1]}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"taskGroup": "x"}, "taskGroup"),
        ({"taskGroup": "999999999"}, "taskGroup"),
        ({"level": "LOUD"}, "level"),
        ({"level": "-5"}, "level"),
        ({"limit": "2001"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"after": "soon"}, "after"),
    ],
)
def test_bad_parameters_are_400s_naming_the_field(viewer, logged, params, field):
    job, _, _ = logged
    response = get(viewer, job.id, **params)
    assert response.status_code == 400
    assert [e["path"] for e in response.json()["errors"]] == [field]


def test_a_task_group_of_another_job_is_refused(viewer, logged):
    job, _, other_group = logged
    response = get(viewer, job.id, taskGroup=other_group.id)
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "taskGroup"
    assert f"job {job.id}" in response.json()["errors"][0]["message"]


def test_unknown_job_is_404_and_only_viewers_read(viewer, logged):
    job, _, _ = logged
    assert get(viewer, 987654321).status_code == 404
    assert get(APIClient(), job.id).status_code == 401
    nobody = APIClient()
    nobody.force_authenticate(get_user_model().objects.create_user("nora", password="x" * 20))
    response = get(nobody, job.id)
    assert response.status_code == 403 and "viewer" in response.json()["detail"]


def test_the_reading_function_the_job_page_uses(logged):
    job, groups, _ = logged
    lines = tasklog_reading.recent(job.id, task_group_id=groups[0].id, min_level=40, limit=3)
    assert [line["level"] for line in lines] == ["CRITICAL", "ERROR", "CRITICAL"]
    assert isinstance(lines[0]["at"], datetime.datetime)


def test_lines_outlive_the_running_state_and_go_with_their_job(logged, viewer):
    job, groups, other_group = logged
    kept = TaskLogLine.objects.filter(job=job).count()
    TaskGroup.objects.filter(job=job).delete()  # as the job's cleanup removes its running state
    assert TaskLogLine.objects.filter(job=job).count() == kept > 0
    # The finished job's page and API still filter by the task group it had.
    response = get(viewer, job.id, taskGroup=groups[0].id)
    assert response.status_code == 200 and response.json()["results"]
    other_group.job.delete()
    job.delete()  # history retention
    assert not TaskLogLine.objects.exists()
