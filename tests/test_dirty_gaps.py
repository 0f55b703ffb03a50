"""Gaps a client of the dirty-job contract would notice, each closed and shown here on real
PostgreSQL through the engine's own steps: the pending-incident TTL counts from the incident on
the database's clock and spares a restore waiting for slots, recent episodes are in job detail,
a running job's incidents are bounded, negative sizes are refused at startup, an operator
acknowledges an UNKNOWN job (which stays UNKNOWN), an older member cannot join nor an older
master campaign while tracked jobs run, old masters are seen, and the submit check holds against
a racing registration."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from engine import dirty
from engine.cluster import membership
from engine.cluster.election import Leadership, MasterRefused
from engine.jobconfig import ConfigError
from engine.jobs.submission import submit_job
from engine.locks import EVENT_APPEND
from engine.models import (
    EngineEvent,
    Job,
    MasterCandidate,
    MasterLease,
    Member,
    MemberLossIncident,
    RecoveryAttempt,
    RecoveryEpisode,
)
from engine.states import SlotMode
from history.models import JobHistory
from tests.conftest import role_user
from tests.dirtykit import host_of_both_pipelines, running_job
from tests.enginekit import TWO_PIPELINES
from tests.test_dirty_reading import engine_config

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent


TTL = 600.0  # engine.dirty-task.pending-incident-ttl's default, 10m


def age_incidents(job, seconds: float) -> None:
    """Date the job's incidents back on the database's clock."""
    MemberLossIncident.objects.filter(job=job).update(at=Now() - timedelta(seconds=seconds))


def test_the_pending_incident_ttl_spares_a_restore_still_waiting_for_slots(engine):
    """A restore waiting for slots past the TTL keeps its episode: when slots come and it
    deploys, its attempt counts and the job reads CLEAN (it read UNKNOWN for ever)."""
    # A job filling two members of two slots: once one is lost, one pipeline restores on the
    # slots the cancels free, and the other waits for slots (there are none).
    hosts = [engine.add_member(slots=2) for _ in range(2)]
    job = engine.submit(threshold=2)
    engine.schedule()
    engine.run_deployed()
    engine.lose(hosts[0])
    engine.settle()
    assert engine.restore_due() == ["waiting for slots"]
    assert RecoveryAttempt.objects.filter(job=job, state="PREPARED").count() == 1
    age_incidents(job, TTL + 60)
    expired = dirty.expire_stale_episodes(engine.epoch)

    engine.add_member(slots=2)
    engine.settle()
    assert engine.running(job)
    s = engine.summary(job)
    assert (s["evaluationStatus"], s["trackingComplete"], s["recoveryAttemptCount"]) == (
        "CLEAN",
        True,
        1,
    ), s
    assert set(RecoveryAttempt.objects.filter(job=job).values_list("state", flat=True)) == {
        "CONFIRMED"
    }
    assert RecoveryEpisode.objects.get(job=job).status == "COMPLETED"
    assert not expired


def test_the_pending_incident_ttl_ends_an_episode_no_restore_can_deploy_by_the_database_clock(
    engine, fault, monkeypatch
):
    """The restores deployed without an attempt (their preparation failed: the job reads UNKNOWN
    already) and the job runs again: nothing of the episode can deploy any more, and it can
    never complete (no attempt of it is confirmed), so an incident older than the TTL ends it;
    older on the database's clock, not on a master's that runs an hour ahead."""
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    fault.on(job, "engine_recoveryattempt")
    engine.fail_lost()
    engine.stop_failing()  # the restores are requested; preparing their attempts fails
    fault.off()
    engine.settle()
    assert engine.running(job) and not RecoveryAttempt.objects.filter(job=job).exists()
    age_incidents(job, TTL - 60)
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=1))
    assert not dirty.expire_stale_episodes(engine.epoch)
    monkeypatch.undo()
    assert RecoveryEpisode.objects.get(job=job).status == "ACTIVE"
    age_incidents(job, TTL + 60)
    assert dirty.expire_stale_episodes(engine.epoch)
    episode = RecoveryEpisode.objects.get(job=job)
    assert episode.status == "ABORTED" and "pending-incident-ttl" in episode.end_reason
    s = engine.summary(job)
    assert s["activeEpisodeId"] is None and s["evaluationStatus"] == "UNKNOWN"


def test_job_detail_carries_the_recent_episodes_and_lists_do_not(engine, api):
    job, _ = running_job(engine, threshold=5)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    detail = api.get(f"/api/v1/jobs/{job.id}").json()["dirtyTask"]
    assert detail["recentEpisodes"] == api.get(f"/api/v1/jobs/{job.id}/episodes").json()
    assert detail["recentEpisodes"][0]["status"] == "COMPLETED"
    listed = next(j for j in api.get("/api/v1/jobs").json()["results"] if j["jobId"] == job.id)
    assert "recentEpisodes" not in listed["dirtyTask"]


def test_a_running_jobs_incidents_and_episodes_stay_within_the_history_size(engine, settings):
    settings.ENGINE = {**settings.ENGINE, "dirty-task.event-history-size": 2}
    job, _ = running_job(engine, members=7, threshold=50)
    for _ in range(4):
        engine.lose(next(m for m in engine.alive() if m.id in engine.members_of(job)))
        engine.settle()
        assert engine.running(job)
    assert RecoveryEpisode.objects.filter(job=job).count() == 2
    assert MemberLossIncident.objects.filter(job=job).count() == 2
    summary = engine.summary(job)
    assert summary["memberLossIncidentCount"] == 4 and summary["recoveryEpisodeCount"] == 4


@pytest.mark.parametrize(
    "variable", ["KEEL_DIRTY_TASK_EVENT_HISTORY_SIZE", "KEEL_RETENTION_EVENTS_COUNT"]
)
def test_negative_sizes_are_refused_at_startup(variable):
    import os

    env = {**os.environ, variable: "-1"}
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert f"{variable}: -1 is below the minimum" in proc.stderr
    assert "Traceback" not in proc.stderr


def listed(api, job, evaluation: str) -> bool:
    """Whether ``?evaluationStatus=`` lists the job."""
    page = api.get(f"/api/v1/jobs?evaluationStatus={evaluation}").json()["results"]
    return job.id in {j["jobId"] for j in page}


def test_an_acknowledged_job_stays_unknown_and_says_who_acknowledged_it(engine, api):
    """An acknowledgement accepts that the count cannot be verified; it never makes it
    verified: the job keeps reading UNKNOWN (trackingComplete false, never listed as CLEAN),
    running and finished, with who, when and why in its summary."""
    from rest_framework.test import APIClient

    from engine.dirty.tracking import record_gap

    job, _ = running_job(engine, threshold=3)
    clean = engine.submit(threshold=3)
    record_gap(job.id, "tracker store timed out")
    url = f"/api/v1/jobs/{job.id}/dirty/ack"
    viewer, operator = APIClient(), APIClient()
    viewer.force_authenticate(role_user("vera", "viewer"))
    operator.force_authenticate(role_user("otto", "operator"))
    assert viewer.post(url, {"reason": "checked"}, format="json").status_code == 403
    assert operator.post(url, {}, format="json").status_code == 400
    refused = operator.post(f"/api/v1/jobs/{clean.id}/dirty/ack", {"reason": "x"}, format="json")
    assert refused.status_code == 409 and "reads CLEAN" in refused.json()["detail"]

    response = operator.post(url, {"reason": "checked the restores by hand"}, format="json")
    assert response.status_code == 200, response.json()

    def acknowledged(s: dict, reason: str) -> None:
        assert (s["evaluationStatus"], s["trackingComplete"], s["dirty"]) == (
            "UNKNOWN",
            False,
            False,
        ), s
        assert (s["acknowledgedBy"], s["acknowledgedReason"]) == ("otto", reason)
        assert datetime.fromisoformat(s["acknowledgedAt"]) <= timezone.now()
        assert "acknowledged" not in s  # the flat fields replace the earlier object

    acknowledged(response.json(), "checked the restores by hand")
    assert response.json()["incompleteReason"] == "tracker store timed out"  # its gap stays
    acknowledged(
        api.get(f"/api/v1/jobs/{job.id}").json()["dirtyTask"], "checked the restores by hand"
    )
    assert not listed(api, job, "CLEAN") and listed(api, job, "UNKNOWN")
    event = EngineEvent.objects.get(kind="dirty.acknowledged", job_id=job.id)
    assert event.payload["previousReason"] == "tracker store timed out"
    assert (event.payload["by"], event.payload["evaluation"]) == ("otto", "UNKNOWN")
    # Acknowledging again replaces who and why; each one is audited.
    again = operator.post(url, {"reason": "checked again"}, format="json")
    assert again.status_code == 200
    acknowledged(again.json(), "checked again")

    # The finished job's record keeps it so.
    engine.cancel(job)
    acknowledged(engine.summary(job), "checked again")
    assert JobHistory.objects.get(job=job).dirty_task["evaluationStatus"] == "UNKNOWN"
    assert not listed(api, job, "CLEAN") and listed(api, job, "UNKNOWN")
    # A finished job's frozen summary is acknowledged the same way.
    finished = operator.post(url, {"reason": "post-mortem done"}, format="json")
    assert finished.status_code == 200
    acknowledged(finished.json(), "post-mortem done")
    acknowledged(api.get(f"/api/v1/jobs/{job.id}").json()["dirtyTask"], "post-mortem done")
    assert not listed(api, job, "CLEAN")
    assert EngineEvent.objects.filter(kind="dirty.acknowledged", job_id=job.id).count() == 3


def test_an_older_member_cannot_join_while_tracked_jobs_run(engine, caplog):
    engine.add_member(slots=8)
    job = engine.submit(threshold=2)
    with pytest.raises(membership.MemberRefused, match="protocol 1 and cannot join"):
        membership.register_member("old-1", 4, SlotMode.FIXED, protocol_version=1)
    assert "registration refused" in caplog.text and f"jobs {job.id}" in caplog.text
    assert not Member.objects.filter(name="old-1").exists()
    engine.cancel(job)
    session = membership.register_member("old-1", 4, SlotMode.FIXED, protocol_version=1)
    session.close()
    assert Member.objects.get(name="old-1").protocol_version == 1


def test_an_older_master_cannot_campaign_while_tracked_jobs_run(engine, caplog):
    """As an older worker cannot join, with the same message: the lease and the lock are left
    to current masters, and so is a takeover that a tracked job's submission overtook. Once no
    tracked job runs it may lead, and from its takeover on it refuses enabling."""
    engine.add_member(slots=8)
    job = engine.submit(threshold=2)
    with pytest.raises(membership.MemberRefused) as worker:
        membership.register_member("old-1", 4, SlotMode.FIXED, protocol_version=1)
    old = Leadership("master-old", lease_timeout=3.0, protocol_version=1)
    try:
        assert not old.campaign() and not old.campaign() and not old.active
        assert old.refused == (
            str(worker.value)
            .replace("member old-1", "master master-old")
            .replace("cannot join", "cannot campaign")
            .replace("this worker", "this master")
        )
        assert f"jobs {job.id}" in old.refused
        assert caplog.text.count(f"campaign refused: {old.refused}") == 1  # once, not per try
        assert old._lock_conn is None  # it never took the leadership lock
        with pytest.raises(MasterRefused, match="master master-old runs protocol 1 and cannot"):
            old._take_over()  # a tracked job submitted between its check and its takeover
        assert MasterLease.objects.get(id=1).epoch == engine.epoch
        assert not EngineEvent.objects.filter(kind="master.elected").exists()

        engine.cancel(job)
        assert old.campaign() and old.refused == "" and old.epoch == engine.epoch + 1
        # Seen as an older master from its takeover, before its loop records it.
        with pytest.raises(ConfigError, match="master master-old runs protocol 1"):
            engine.submit(threshold=2)
    finally:
        old.step_down()


def test_an_older_master_refuses_enabling_as_an_older_member_does(engine, api):
    engine.add_member(slots=8)
    MasterCandidate.objects.create(
        name="master-old", pid=1, host="h", state="STANDBY", protocol_version=1
    )
    response = api.post("/api/v1/jobs", {"config": engine_config(threshold=2)}, format="json")
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert "master master-old runs protocol 1" in error["message"]
    MasterCandidate.objects.filter(name="master-old").update(state="STOPPED")
    assert (
        api.post("/api/v1/jobs", {"config": engine_config(threshold=2)}, format="json").status_code
        == 201
    )


def test_the_submit_check_holds_against_a_racing_older_registration(engine):
    """An older member registers while a tracked job is submitted: whichever way they
    interleave, they never both succeed. The event-append lock, held here, stalls the
    registration after its check; the submission then runs its own check meanwhile."""
    engine.add_member(slots=8)
    db = connection.settings_dict
    url = f"postgresql://{db['USER'] or 'root'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    holder = psycopg.connect(f"{url}/{db['NAME']}", autocommit=True)
    results: dict[str, object] = {}

    def register() -> None:
        try:
            results["member"] = membership.register_member(
                "old-racer", 4, SlotMode.FIXED, protocol_version=1
            )
        except Exception as exc:
            results["member"] = exc

    def submit() -> None:
        try:
            results["job"] = submit_job(TWO_PIPELINES.format(threshold=2, retries=3))
        except Exception as exc:
            results["job"] = exc
        finally:
            connection.close()

    def waiting() -> int:
        return holder.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND wait_event = 'advisory' AND datname = current_database()"
        ).fetchone()[0]

    holder.execute("SELECT pg_advisory_lock(%s, %s)", EVENT_APPEND)
    threads = [threading.Thread(target=register)]
    try:
        threads[0].start()
        deadline = time.monotonic() + 10
        while waiting() < 1:
            assert time.monotonic() < deadline, "the registration never reached its append"
            time.sleep(0.01)
        threads.append(threading.Thread(target=submit))
        threads[1].start()
        while waiting() < 2:
            assert time.monotonic() < deadline, "the submission never waited"
            time.sleep(0.01)
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s, %s)", EVENT_APPEND)
        for thread in threads:
            thread.join(timeout=30)
        holder.close()
    member, job = results["member"], results["job"]
    if isinstance(member, membership.MemberSession):
        member.close()
    both = isinstance(member, membership.MemberSession) and isinstance(job, Job)
    assert not both, "an older member joined while a tracked job was accepted"
    assert isinstance(job, ConfigError) and "runs protocol 1" in str(job.errors)
