"""Dirty-job tracking on real PostgreSQL, driven through the engine's own steps: reading it.

The summary of a running job and of a finished one (from its history record) are the same;
disabled jobs and records from before the feature read DISABLED, an enabled finished job whose
record and state are both lost UNKNOWN; the history keeps the configured number of episodes;
the REST contract (``dirtyTask``, the filters, ``/episodes``), its authentication and the
refusal to enable with an older member alive; and the dashboard.
"""

from __future__ import annotations

import re

import pytest

from engine import dirty
from engine.models import (
    DirtyJobState,
    Job,
    MemberLossIncident,
    RecoveryAttempt,
    RecoveryEpisode,
)
from history.models import JobHistory
from tests.conftest import role_user
from tests.dirtykit import host_of_both_pipelines, running_job

pytestmark = pytest.mark.django_db(transaction=True)


def test_running_and_finished_jobs_expose_the_same_summary(engine):
    job, _ = running_job(engine, threshold=1)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    running = engine.summary(job)
    episodes = dirty.job_episodes(Job.objects.get(id=job.id))
    engine.cancel(job)
    assert Job.objects.get(id=job.id).status == "CANCELED"
    assert engine.summary(job) == running
    assert dirty.job_episodes(Job.objects.get(id=job.id)) == episodes
    # The running state is gone, only after the history was written.
    assert not DirtyJobState.objects.filter(job_id=job.id).exists()
    assert not RecoveryEpisode.objects.filter(job=job).exists()
    assert JobHistory.objects.get(job=job).dirty_task == running


def test_disabled_by_default_and_old_finished_records_read_as_disabled(engine):
    job, _ = running_job(engine, threshold=-1)
    assert not DirtyJobState.objects.exists()
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    assert not MemberLossIncident.objects.exists() and not RecoveryEpisode.objects.exists()
    assert engine.summary(job) == {"evaluationStatus": "DISABLED", "dirty": False}
    # A finished job recorded before the history record existed (no row at all), and one
    # whose record has no dirty summary: both read as DISABLED, other fields untouched.
    engine.cancel(job)
    JobHistory.objects.filter(job=job).delete()
    assert engine.summary(job) == {"evaluationStatus": "DISABLED", "dirty": False}
    assert dirty.job_episodes(Job.objects.get(id=job.id)) == []
    annotated = dirty.annotate(Job.objects.filter(id=job.id)).get()
    assert annotated.dirty_evaluation == "DISABLED"


def test_an_enabled_finished_job_without_snapshot_nor_state_reads_unknown(engine, api, client):
    """What an enabled job counted is lost (its record gone, or written without a summary, and
    its running state already removed): UNKNOWN in detail, lists, filters and pages, never
    DISABLED (not tracked) nor CLEAN."""
    job, _ = running_job(engine, threshold=2)
    engine.cancel(job)
    assert not DirtyJobState.objects.filter(job_id=job.id).exists()
    client.force_login(role_user("dirty-watcher", "viewer"))

    def ids(query: str) -> set[int]:
        response = api.get(f"/api/v1/jobs?{query}")
        assert response.status_code == 200, response.json()
        return {j["jobId"] for j in response.json()["results"]}

    for lose_record in (
        lambda: JobHistory.objects.filter(job=job).update(dirty_task=None),
        lambda: JobHistory.objects.filter(job=job).delete(),
    ):
        lose_record()
        s = engine.summary(job)
        assert s["evaluationStatus"] == "UNKNOWN" and not s["trackingComplete"], s
        assert "neither a dirty-job snapshot nor state" in s["incompleteReason"]
        detail = api.get(f"/api/v1/jobs/{job.id}").json()["dirtyTask"]
        assert detail["evaluationStatus"] == "UNKNOWN" and detail["threshold"] == 2
        [listed] = [j for j in api.get("/api/v1/jobs").json()["results"] if j["jobId"] == job.id]
        assert listed["dirtyTask"]["evaluationStatus"] == "UNKNOWN"
        assert job.id in ids("evaluationStatus=UNKNOWN")
        assert job.id not in ids("evaluationStatus=DISABLED") | ids("evaluationStatus=CLEAN")
        page = client.get("/jobs/?evaluationStatus=UNKNOWN", follow=True).content.decode()
        assert f'data-job-id="{job.id}"' in page
        assert 'data-field="evaluationStatus">UNKNOWN</span>' in page
        assert (
            f'data-job-id="{job.id}"'
            not in client.get("/jobs/?evaluationStatus=DISABLED", follow=True).content.decode()
        )
        detail_page = client.get(f"/jobs/{job.id}/", follow=True).content.decode()
        assert 'class="badge dirty-unknown">UNKNOWN</span>' in detail_page


def test_history_keeps_the_configured_number_of_episodes(engine, settings):
    settings.ENGINE = {**settings.ENGINE, "dirty-task.event-history-size": 2}
    job, _ = running_job(engine, members=6, threshold=10, retries=10)
    for _ in range(3):
        engine.lose(next(m for m in engine.alive() if m.id in engine.members_of(job)))
        engine.settle()
        assert engine.running(job)
    s = engine.summary(job)
    assert s["recoveryEpisodeCount"] == 3 and s["recoveryAttemptCount"] == 3
    assert len(dirty.job_episodes(Job.objects.get(id=job.id))) == 2


@pytest.fixture
def api():
    from rest_framework.test import APIClient

    from tests.conftest import role_user

    user = role_user("dirty-operator", "operator")
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_rest_fields_filters_and_episodes(engine, api):
    dirty_job, _ = running_job(engine, members=4, threshold=1)
    clean_job = engine.submit(threshold=5)
    disabled_job = engine.submit(threshold=-1)
    engine.schedule()
    engine.run_deployed()
    engine.lose(host_of_both_pipelines(engine, dirty_job))
    engine.settle()

    detail = api.get(f"/api/v1/jobs/{dirty_job.id}").json()["dirtyTask"]
    assert set(detail) >= {
        "dirty",
        "evaluationStatus",
        "trackingComplete",
        "threshold",
        "recoveryAttemptCount",
        "recoveryEpisodeCount",
        "memberLossIncidentCount",
        "activeEpisodeId",
        "lastLeaveClassification",
        "lastLostMemberUuid",
        "lastLostAddress",
        "lastCountedTime",
        "firstDirtyTime",
    }
    assert detail["evaluationStatus"] == "DIRTY" and detail["threshold"] == 1
    assert api.get(f"/api/v1/jobs/{disabled_job.id}").json()["dirtyTask"] == {
        "evaluationStatus": "DISABLED",
        "dirty": False,
    }

    def ids(query: str) -> set[int]:
        response = api.get(f"/api/v1/jobs?{query}")
        assert response.status_code == 200, response.json()
        return {j["jobId"] for j in response.json()["results"]}

    assert ids("dirty=true") == {dirty_job.id}
    assert ids("dirty=false") == {clean_job.id, disabled_job.id}
    assert ids("evaluationStatus=DIRTY") == {dirty_job.id}
    assert ids("evaluationStatus=CLEAN") == {clean_job.id}
    assert ids("evaluationStatus=DISABLED") == {disabled_job.id}
    assert ids("evaluationStatus=UNKNOWN") == set()
    listed = {j["jobId"]: j["dirtyTask"] for j in api.get("/api/v1/jobs").json()["results"]}
    assert listed[dirty_job.id] == {
        "dirty": True,
        "evaluationStatus": "DIRTY",
        "recoveryAttemptCount": 1,
    }
    assert listed[disabled_job.id] == {"evaluationStatus": "DISABLED", "dirty": False}
    bad = api.get("/api/v1/jobs?evaluationStatus=MAYBE")
    assert bad.status_code == 400 and "evaluationStatus" in str(bad.json())

    [episode] = api.get(f"/api/v1/jobs/{dirty_job.id}/episodes").json()
    assert set(episode) >= {
        "episodeId",
        "status",
        "startedAt",
        "endedAt",
        "generation",
        "classification",
        "incidents",
        "attempts",
    }
    assert episode["status"] == "COMPLETED" and episode["generation"] == 1
    assert set(episode["incidents"][0]) >= {"lostMemberUuid", "lostAddress", "classification", "at"}
    assert set(episode["attempts"][0]) >= {
        "attemptId",
        "pipelineId",
        "prepareSequence",
        "state",
        "at",
    }
    assert api.get("/api/v1/jobs/999999/episodes").status_code == 404
    assert api.get(f"/api/v1/jobs/{disabled_job.id}/episodes").json() == []


def test_every_api_route_needs_authentication():
    """Every route of the API, new ones included, refuses an anonymous caller."""
    from django.urls import URLPattern
    from rest_framework.test import APIClient

    from engine.api.urls import urlpatterns

    client = APIClient()
    for pattern in urlpatterns:
        assert isinstance(pattern, URLPattern)
        path = "/api/v1/" + re.sub(
            r"<(\w+):\w+>",
            lambda m: {"int": "1", "uuid": "00000000-0000-0000-0000-000000000001"}[m[1]],
            str(pattern.pattern),
        )
        response = client.get(path)
        if path == "/api/v1/docs":  # a page for browsers: to the login page and back
            assert response.status_code == 302, path
            assert response["Location"].startswith("/accounts/login/?next="), path
        else:
            assert response.status_code in (401, 403), path


def test_enabling_is_refused_while_an_older_member_is_alive(engine, api):
    from engine.models import Member

    old = engine.add_member()
    Member.objects.filter(id=old.id).update(protocol_version=1)
    config = engine_config(threshold=2)
    response = api.post("/api/v1/jobs", {"config": config}, format="json")
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["path"] == "env.job.dirty-task.threshold"
    assert old.name in error["message"] and "protocol 1" in error["message"]
    assert not Job.objects.exists()  # nothing was created
    assert (
        api.post("/api/v1/jobs", {"config": engine_config(threshold=-1)}, format="json").status_code
        == 201
    )
    engine.lose(old)
    assert api.post("/api/v1/jobs", {"config": config}, format="json").status_code == 201


def engine_config(threshold: int) -> str:
    from tests.enginekit import TWO_PIPELINES

    return TWO_PIPELINES.format(threshold=threshold, retries=3)


def test_dashboard_filters_by_recovery_label_and_shows_episodes(engine, client):

    dirty_job, _ = running_job(engine, members=4, threshold=1)
    clean_job = engine.submit(threshold=5)
    engine.schedule()
    engine.run_deployed()
    engine.lose(host_of_both_pipelines(engine, dirty_job))
    engine.settle()
    assert client.get(f"/jobs/{dirty_job.id}/").status_code == 302  # login first
    user = role_user("watcher", "viewer")
    client.force_login(user)

    page = client.get("/?recovery=DIRTY").content.decode()
    recent = page.split('<h2 class="section">Recent jobs</h2>')[1]  # (slots link every job)
    assert f'href="/jobs/{dirty_job.id}/"' in recent
    assert f'href="/jobs/{clean_job.id}/"' not in recent
    assert 'hx-get="/?recovery=DIRTY"' in page  # the live refresh keeps the filter
    everything = client.get("/?recovery=whatever").content.decode()
    assert f'href="/jobs/{clean_job.id}/"' in everything

    detail = client.get(f"/jobs/{dirty_job.id}/").content.decode()
    attempt = RecoveryAttempt.objects.filter(job=dirty_job).first()
    assert "DIRTY" in detail and attempt.attempt_id in detail and "COMPLETED" in detail
    partial = client.get(f"/jobs/{dirty_job.id}/", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial and attempt.attempt_id in partial
    assert client.get("/jobs/999999/").status_code == 404
