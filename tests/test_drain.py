"""Planned leaves on real PostgreSQL, driven through the engine's own steps (the live cluster:
tests/test_drain_cluster.py): a drained member's task groups move through the normal restore
path, its episode is PLANNED_VERIFIED and counts nothing, it costs no retry, the member leaves
LEFT once empty; an UNCLASSIFIED loss joining the episode makes it count; the member's own
SIGTERM stays UNCLASSIFIED; a drain expires; the request is audited and needs the operator role.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine.jobs import drain
from engine.models import (
    EngineEvent,
    Member,
    MemberDrain,
    MemberLossIncident,
    Pipeline,
    RecoveryEpisode,
    TaskGroup,
)
from tests.conftest import role_user
from tests.dirtykit import host_of_both_pipelines, running_job

pytestmark = pytest.mark.django_db(transaction=True)


def drain_until_settled(e, member: Member) -> None:
    """The master's drain step and the restores it starts, until nothing changes."""
    for _ in range(10):
        did, _ = drain.step(e.epoch)
        e.stop_failing()
        restored = e.restore_due()
        e.run_deployed()
        if not did and "restored" not in restored:
            return


def test_a_drained_members_work_moves_and_its_episode_counts_nothing(engine):
    operator = role_user("olga", "operator")
    job, _ = running_job(engine, threshold=1, retries=0)
    victim = host_of_both_pipelines(engine, job)
    record, created = drain.request_drain(victim.uuid, operator, "kernel upgrade")
    assert created and record.requested_by_name == "olga" and record.state == "DRAINING"

    drain_until_settled(engine, victim)

    record.refresh_from_db()
    victim.refresh_from_db()
    assert record.state == "LEFT" and record.moved_task_groups == 2
    assert victim.state == "LEFT"
    assert engine.running(job) and victim.id not in engine.members_of(job)
    # The normal restore path: a new attempt on other members, and no retry used up
    # (job.retry.times = 0 would have failed the job on a real loss).
    assert all(p.restore_count == 1 and p.planned_restores == 1 for p in Pipeline.objects.all())
    incident = MemberLossIncident.objects.get(job=job)
    assert incident.classification == "PLANNED_VERIFIED"
    episode = RecoveryEpisode.objects.get(job=job)
    assert (episode.classification, episode.status, episode.generation) == (
        "PLANNED_VERIFIED",
        "COMPLETED",
        1,
    )
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 0 and s["evaluationStatus"] == "CLEAN"
    assert s["lastLeaveClassification"] == "PLANNED_VERIFIED"
    left = EngineEvent.objects.get(kind="member.left", member=victim)
    assert left.payload["classification"] == "PLANNED_VERIFIED"
    assert left.payload["reason"] == "drained by olga: kernel upgrade"
    requested = EngineEvent.objects.get(kind="member.drain-requested")
    assert requested.payload["requestedBy"] == "olga"
    assert requested.payload["reason"] == "kernel upgrade"


def test_a_crash_joining_a_planned_episode_makes_every_generation_count(engine):
    job, _ = running_job(engine, members=5, threshold=1)
    first = host_of_both_pipelines(engine, job)
    drain.request_drain(first.uuid, role_user("olga", "operator"), "rack move")
    drain.step(engine.epoch)
    engine.stop_failing()
    assert engine.restore_due() == ["restored", "restored"]  # DEPLOYING: confirmed, planned
    assert engine.summary(job)["recoveryAttemptCount"] == 0
    # Before the redeployment runs, a crash takes a member it was deployed to: an UNCLASSIFIED
    # incident joins the still active, planned episode.
    second = TaskGroup.objects.filter(job=job, status="DEPLOYING").first().member
    engine.lose(second)
    engine.settle()
    drain_until_settled(engine, first)

    assert engine.running(job)
    episode = RecoveryEpisode.objects.get(job=job)
    assert (episode.classification, episode.generation) == ("UNCLASSIFIED", 2)
    # Both generations count: the planned one as well, now that the episode is not planned.
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 2 and s["evaluationStatus"] == "DIRTY"
    assert sorted(MemberLossIncident.objects.values_list("classification", flat=True)) == [
        "PLANNED_VERIFIED",
        "UNCLASSIFIED",
    ]


def test_a_planned_move_does_not_use_up_the_retries(engine):
    job, _ = running_job(engine, members=4, threshold=1, retries=1)
    drain.request_drain(
        host_of_both_pipelines(engine, job).uuid, role_user("olga", "operator"), "patching"
    )
    drain.step(engine.epoch)
    engine.settle()
    # One retry left for a real loss: the job restores again instead of failing.
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    assert engine.running(job)
    assert all(
        (p.restore_count, p.planned_restores) == (2, 1) for p in Pipeline.objects.filter(job=job)
    )
    assert engine.summary(job)["recoveryAttemptCount"] == 1


def test_the_members_own_sigterm_during_a_drain_stays_unclassified(engine):
    job, _ = running_job(engine, threshold=1)
    victim = host_of_both_pipelines(engine, job)
    record, _ = drain.request_drain(victim.uuid, role_user("olga", "operator"), "maintenance")
    engine.leave(victim)  # its pod's preStop hook is not trusted to classify its own exit
    drain.step(engine.epoch)
    engine.settle()
    record.refresh_from_db()
    assert record.state == "ABORTED" and "LEFT" in record.end_reason
    assert MemberLossIncident.objects.get(job=job).classification == "UNCLASSIFIED"
    assert engine.summary(job)["evaluationStatus"] == "DIRTY"


def test_a_draining_member_takes_no_new_work_and_an_expired_drain_gives_it_back(engine):
    member = engine.add_member(slots=4)
    record, _ = drain.request_drain(member.uuid, role_user("olga", "operator"), "maintenance")
    job = engine.submit(threshold=0)
    engine.schedule()
    assert not TaskGroup.objects.filter(job=job).exclude(member=None).exists()
    assert job.__class__.objects.get(id=job.id).status == "PENDING"

    MemberDrain.objects.filter(id=record.id).update(expires_at=timezone.now() - timedelta(1))
    drain.step(engine.epoch)
    record.refresh_from_db()
    assert record.state == "EXPIRED"
    engine.schedule()
    assert set(TaskGroup.objects.filter(job=job).values_list("member_id", flat=True)) == {member.id}


def test_a_drain_is_refused_without_room_or_a_reason_and_asked_twice_is_the_same(engine):
    operator = role_user("olga", "operator")
    only = engine.add_member(slots=4)
    engine.submit(threshold=0)
    engine.schedule()
    with pytest.raises(drain.DrainRefused, match="free slot"):
        drain.request_drain(only.uuid, operator, "maintenance")
    with pytest.raises(drain.DrainRefused, match="reason"):
        drain.request_drain(only.uuid, operator, "  ")
    first, created = drain.request_drain(only.uuid, operator, "maintenance", force=True)
    again, created_again = drain.request_drain(only.uuid, operator, "maintenance")
    assert created and not created_again and again.request_id == first.request_id


def test_the_drain_endpoint_needs_an_operator_and_audits_who_and_why(engine):
    from rest_framework.test import APIClient

    member = engine.add_member(slots=4)
    engine.add_member(slots=4)
    url = f"/api/v1/members/{member.uuid}/drain"
    viewer, operator = APIClient(), APIClient()
    viewer.force_authenticate(role_user("vera", "viewer"))
    operator.force_authenticate(role_user("olga", "operator"))

    refused = viewer.post(url, {"reason": "maintenance"}, format="json")
    assert refused.status_code == 403 and "drain_member" in refused.json()["detail"]
    assert APIClient().post(url, {"reason": "x"}, format="json").status_code in (401, 403)
    missing = operator.post(url, {}, format="json")
    assert missing.status_code == 400
    assert [e["path"] for e in missing.json()["errors"]] == ["reason"]
    assert not MemberDrain.objects.exists()

    accepted = operator.post(url, {"reason": "disk swap"}, format="json")
    assert accepted.status_code == 202, accepted.json()
    body = accepted.json()
    assert body["requestedBy"] == "olga" and body["reason"] == "disk swap"
    assert body["state"] == "DRAINING" and body["memberUuid"] == str(member.uuid)
    again = operator.post(url, {"reason": "disk swap"}, format="json")
    assert again.status_code == 200 and again.json()["requestId"] == body["requestId"]

    listed = viewer.get(url)
    assert listed.status_code == 200 and [d["requestId"] for d in listed.json()] == [
        body["requestId"]
    ]
    members = {m["uuid"]: m for m in viewer.get("/api/v1/members").json()}
    assert members[str(member.uuid)]["drain"]["requestId"] == body["requestId"]
    unknown = operator.post(
        "/api/v1/members/00000000-0000-0000-0000-000000000000/drain", {"reason": "x"}
    )
    assert unknown.status_code == 404
    engine.lose(member)
    gone = operator.post(url, {"reason": "again"}, format="json")
    assert gone.status_code == 409 and "only an ALIVE member" in gone.json()["detail"]
