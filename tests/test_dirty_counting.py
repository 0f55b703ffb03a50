"""Dirty-job tracking on real PostgreSQL, driven through the engine's own steps: what is counted.

A member loss opens one recovery episode and registers an incident; an attempt counts when its
redeployment starts, once per generation whatever the number of pipelines; duplicates, ordinary
failures, preparations that never deploy and obsolete or stale restores count nothing, and
reaching the threshold changes neither the job's status nor its retries. The same on a live
cluster: tests/test_dirty_cluster_losses.py.
"""

from __future__ import annotations

import pytest

from engine import dirty
from engine.models import (
    EngineEvent,
    Job,
    MemberLossIncident,
    Pipeline,
    RecoveryAttempt,
    RecoveryEpisode,
    TaskGroup,
)
from history.models import JobHistory
from tests.dirtykit import attempts, host_of_both_pipelines, kinds, running_job

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_loss_affecting_two_pipelines_counts_one_first_generation_attempt(engine):
    job, _ = running_job(engine)
    victim = host_of_both_pipelines(engine, job)
    engine.lose(victim)
    # Registered in the removal itself, before any task group was failed.
    assert MemberLossIncident.objects.filter(job=job).count() == 1
    assert TaskGroup.objects.filter(job=job, member=victim, status="RUNNING").count() == 2
    engine.settle()
    assert engine.running(job)
    assert sorted(attempts(job)) == sorted(
        [
            (f"{a.episode_id}-{a.pipeline.index}-1", "CONFIRMED")
            for a in RecoveryAttempt.objects.all()
        ]
    )
    assert len(attempts(job)) == 2
    episode = RecoveryEpisode.objects.get(job=job)
    assert (episode.status, episode.generation) == ("COMPLETED", 1)
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 1 and s["recoveryEpisodeCount"] == 1
    assert s["memberLossIncidentCount"] == 1 and s["evaluationStatus"] == "CLEAN"
    assert s["lastLostMemberUuid"] == str(victim.uuid) and s["lastLostAddress"] == victim.address
    assert s["activeEpisodeId"] is None and s["lastCountedTime"] is not None


def test_a_second_deployment_attempt_advances_the_count_exactly_once(engine):
    job, _ = running_job(engine, members=4, threshold=2)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    assert engine.restore_due() == ["restored", "restored"]  # DEPLOYING: generation 1, count 1
    assert engine.summary(job)["recoveryAttemptCount"] == 1
    # The redeployment fails: its member is lost before the task groups run.
    second = TaskGroup.objects.filter(job=job, status="DEPLOYING").first().member
    engine.lose(second)
    engine.settle()
    assert engine.running(job)
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 2 and s["recoveryEpisodeCount"] == 1
    assert s["memberLossIncidentCount"] == 2
    assert s["dirty"] and s["evaluationStatus"] == "DIRTY" and s["firstDirtyTime"]
    episode = RecoveryEpisode.objects.get(job=job)
    assert (episode.status, episode.generation) == ("COMPLETED", 2)
    assert kinds(job, "dirty.marked") == 1
    # Sequences are per pipeline: the pipelines the second loss hit have a -2 attempt.
    assert {a for a, _ in attempts(job) if a.endswith("-2")}
    assert all(state == "CONFIRMED" for _, state in attempts(job))


def test_duplicate_member_removed_and_duplicate_confirmation_are_no_ops(engine):
    job, _ = running_job(engine)
    victim = host_of_both_pipelines(engine, job)
    engine.lose(victim)
    engine.redeliver_loss(victim)  # the same member-removed event, delivered again
    assert not engine.lose(victim)  # and the removal itself happens once only
    engine.settle()
    before = (engine.summary(job), attempts(job), EngineEvent.objects.count())
    engine.redeliver_loss(victim)
    from django.db import transaction

    for pipeline in Pipeline.objects.filter(job=job):
        with transaction.atomic():
            assert dirty.on_restore_deploying(Job.objects.get(id=job.id), pipeline, 1, 1) == []
    assert (engine.summary(job), attempts(job), EngineEvent.objects.count()) == before
    assert engine.summary(job)["memberLossIncidentCount"] == 1
    assert engine.summary(job)["recoveryAttemptCount"] == 1


def test_ordinary_task_failures_are_not_counted(engine):
    job, _ = running_job(engine)
    engine.ordinary_failure(job)
    engine.stop_failing()
    job.refresh_from_db()
    assert job.status == "FAILED"
    assert not RecoveryEpisode.objects.filter(job=job).exists()
    s = engine.summary(job)  # from history now
    assert s["recoveryAttemptCount"] == 0 and s["evaluationStatus"] == "CLEAN"


def test_restore_preparation_without_deploying_is_not_counted(engine):
    job, _ = running_job(engine, members=2)  # 8 slots: after a loss only 4 remain
    victim = host_of_both_pipelines(engine, job)
    engine.lose(victim)
    engine.fail_lost()
    engine.stop_failing()
    other_job = engine.submit(threshold=-1)  # takes the 4 left before the restore runs
    engine.schedule()
    assert set(engine.restore_due()) <= {"waiting for slots", "obsolete"}
    assert {state for _, state in attempts(job)} == {"PREPARED"}
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 0 and s["activeEpisodeId"] is not None
    # The job ends before it could redeploy: the episode aborts, nothing was counted.
    engine.cancel(job)
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 0 and s["activeEpisodeId"] is None
    history = JobHistory.objects.get(job=job)
    assert history.episodes[0]["status"] == "ABORTED"
    assert {a["state"] for a in history.episodes[0]["attempts"]} == {"ABORTED"}
    assert other_job.dirty_threshold == -1


def test_a_completed_episode_is_not_consumed_by_a_later_ordinary_failure(engine):
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    assert RecoveryEpisode.objects.get(job=job).status == "COMPLETED"
    engine.ordinary_failure(job)
    engine.stop_failing()
    assert Job.objects.get(id=job.id).status == "FAILED"  # no restore, no attempt
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 1 and s["recoveryEpisodeCount"] == 1
    history = JobHistory.objects.get(job=job)
    assert [e["status"] for e in history.episodes] == ["COMPLETED"]


def test_a_member_that_stops_itself_is_unclassified_and_counted_after_deployment(engine):
    """A pod restart: the member leaves on SIGTERM, with no trusted planned-leave intent."""
    job, _ = running_job(engine)
    leaver = host_of_both_pipelines(engine, job)
    engine.leave(leaver)
    incident = MemberLossIncident.objects.get(job=job)
    assert incident.classification == "UNCLASSIFIED"
    assert engine.summary(job)["recoveryAttemptCount"] == 0  # not before deployment
    engine.settle()
    s = engine.summary(job)
    assert s["lastLeaveClassification"] == "UNCLASSIFIED" and s["recoveryAttemptCount"] == 1
    assert RecoveryEpisode.objects.get(job=job).classification == "UNCLASSIFIED"


def test_reaching_the_threshold_changes_neither_status_nor_retries(engine):
    job, _ = running_job(engine, members=5, threshold=1, retries=1)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    assert engine.running(job) and engine.summary(job)["evaluationStatus"] == "DIRTY"
    # job.retry.times = 1 is still the restore limit: the next loss fails the job.
    engine.lose(next(m for m in engine.alive() if m.id in engine.members_of(job)))
    engine.settle()
    job.refresh_from_db()
    assert job.status == "FAILED" and "job.retry.times = 1" in job.error_msg
    assert engine.summary(job)["dirty"] is True  # irreversible, and kept in history


def test_a_restore_still_to_deploy_keeps_its_episode_past_the_pending_incident_ttl(
    engine, settings
):
    """The TTL ends only an episode that no restore can still deploy (tests/test_dirty_gaps.py
    shows it ending one): not while the lost task groups are still to fail, nor while their
    pipelines are FAILING, nor while their restores are prepared."""
    settings.ENGINE = {**settings.ENGINE, "dirty-task.pending-incident-ttl": 0.0}
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    assert not dirty.expire_stale_episodes(engine.epoch)
    engine.fail_lost()
    assert not dirty.expire_stale_episodes(engine.epoch)
    engine.stop_failing()
    assert {state for _, state in attempts(job)} == {"PREPARED"}
    assert not dirty.expire_stale_episodes(engine.epoch)
    engine.settle()
    assert RecoveryEpisode.objects.get(job=job).status == "COMPLETED"
    assert engine.summary(job)["recoveryAttemptCount"] == 1


def test_an_obsolete_restore_aborts_its_attempt(engine):
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    from engine.models import Pipeline as P

    pipeline = P.objects.filter(job=job).order_by("index").first()
    P.objects.filter(id=pipeline.id).update(status="FAILED")  # it will never restore
    engine.restore_due()
    states = dict(RecoveryAttempt.objects.filter(job=job).values_list("pipeline_id", "state"))
    assert states[pipeline.id] == "ABORTED"
    assert engine.summary(job)["recoveryAttemptCount"] == 1  # the other pipeline deployed
