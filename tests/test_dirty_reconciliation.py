"""Dirty-job tracking on real PostgreSQL, driven through the engine's own steps: reconciliation.

A new master confirms what the previous one left PREPARED, once; a job whose tracking fell
behind (a failed tracker write, a member event nobody handled, a missing or unreadable state)
reads UNKNOWN, never CLEAN (a missed member event only the jobs that existed at it); a history
snapshot that failed is written later; one job failing its reconciliation does not stop the
others; and a member loss costs the same statements whatever the number of jobs.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from engine import dirty
from engine.master import orchestration
from engine.models import (
    DirtyJobState,
    DirtyTrackingGap,
    EngineEvent,
    Job,
    MemberLossIncident,
    Pipeline,
    RecoveryAttempt,
    RecoveryEpisode,
    TaskGroup,
)
from history.models import JobHistory
from tests.dirtykit import attempts, history_fault, host_of_both_pipelines, kinds, running_job

pytestmark = pytest.mark.django_db(transaction=True)


def test_master_change_before_confirmation_keeps_the_binding(engine):
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    assert {s for _, s in attempts(job)} == {"PREPARED"}
    assert engine.new_master() == 0  # pre-deployment: kept, nothing to confirm yet
    assert {s for _, s in attempts(job)} == {"PREPARED"}
    engine.settle()
    assert engine.summary(job)["recoveryAttemptCount"] == 1
    assert engine.new_master() == 0  # and again after: no duplicate
    assert engine.summary(job)["recoveryAttemptCount"] == 1


def test_master_change_during_confirmation_confirms_once(engine, fault):
    """The confirmation did not commit with the redeployment (a tracker-store failure at that
    instant): the next master's reconciliation confirms the original attempt id, once."""
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    fault.on(job, "engine_recoveryattempt")
    assert engine.restore_due() == ["restored", "restored"]  # recovery is not blocked
    assert {s for _, s in attempts(job)} == {"PREPARED"}
    assert kinds(job, "dirty.tracker-failed") == 2
    # Until it is repaired the job is not CLEAN: the count is behind the truth.
    s = engine.summary(job)
    assert s["evaluationStatus"] == "UNKNOWN" and "confirmation" in s["incompleteReason"]
    fault.off()
    ids = [a for a, _ in attempts(job)]
    assert engine.new_master() == 2
    assert attempts(job) == [(a, "CONFIRMED") for a in ids]
    engine.run_deployed()
    s = engine.summary(job)
    assert s["recoveryAttemptCount"] == 1 and s["evaluationStatus"] == "CLEAN"
    assert engine.new_master() == 0
    assert engine.summary(job)["recoveryAttemptCount"] == 1
    assert RecoveryEpisode.objects.get(job=job).status == "COMPLETED"


def test_housekeeping_leaves_a_recovery_in_flight_to_its_normal_path(engine, fault):
    """The master's housekeeping reconciles again, but only attempts and episodes left alone
    for engine.housekeeping.settle: during a storm it would otherwise lock every recovering job, one
    transaction each, against their own restores. What it skipped it repairs once settled."""
    job = redeployed_unconfirmed(engine, fault)
    fault.off()
    settle = float(settings.ENGINE["housekeeping.settle"])
    assert orchestration.reconcile(engine.epoch, settle) == 0  # just prepared: not its turn
    assert {s for _, s in attempts(job)} == {"PREPARED"}
    RecoveryAttempt.objects.filter(job=job).update(
        prepared_at=Now() - timedelta(seconds=settle + 1)
    )
    assert orchestration.reconcile(engine.epoch, settle) == 2
    assert {s for _, s in attempts(job)} == {"CONFIRMED"}


def test_reconciliation_of_an_unexplained_attempt_is_unknown(engine):
    job, _ = running_job(engine)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    attempt = RecoveryAttempt.objects.filter(job=job).first()
    Pipeline.objects.filter(id=attempt.pipeline_id).update(status="CREATED")  # unexplainable
    engine.new_master()
    s = engine.summary(job)
    assert s["evaluationStatus"] == "UNKNOWN" and not s["trackingComplete"]
    assert "PREPARED" in s["incompleteReason"]


def test_missing_state_lagging_watermark_and_tracker_failure_are_unknown(engine, fault):
    job, _ = running_job(engine)
    healthy = engine.submit(threshold=2)
    engine.schedule()
    engine.run_deployed()
    assert engine.summary(job)["evaluationStatus"] == "CLEAN"
    # A tracker failure during a member loss: the loss is handled (the job restores) but this
    # job's watermark stays behind: UNKNOWN for ever, never CLEAN; the other job is unaffected.
    fault.on(job)
    engine.lose(host_of_both_pipelines(engine, job))
    fault.off()
    assert kinds(job, "dirty.tracker-failed") == 1
    assert DirtyTrackingGap.objects.get(job=job).member_event_sequence == (
        dirty.Sequences.read(job.id).member_event
    )
    engine.settle()
    assert engine.running(job)
    s = engine.summary(job)
    assert s["evaluationStatus"] == "UNKNOWN" and not s["trackingComplete"]
    assert "member event" in s["incompleteReason"]
    assert engine.summary(healthy)["evaluationStatus"] in ("CLEAN", "DIRTY")
    assert engine.summary(healthy)["trackingComplete"]
    # A later member event does not hide the lag.
    engine.lose(engine.add_member())
    assert engine.summary(job)["evaluationStatus"] == "UNKNOWN"
    # A missing state is UNKNOWN too (never a clean default).
    DirtyJobState.objects.filter(job_id=healthy.id).delete()
    s = engine.summary(healthy)
    assert s["evaluationStatus"] == "UNKNOWN" and not s["trackingComplete"]
    # A state row of a newer layout than this engine reads is UNKNOWN as well.
    third = engine.submit(threshold=2)
    DirtyJobState.objects.filter(job_id=third.id).update(schema_version=dirty.SCHEMA_VERSION + 1)
    assert engine.summary(third)["evaluationStatus"] == "UNKNOWN"
    # And the list annotation (REST lists and filters) agrees with every one of these.
    for j in (job, healthy, third):
        annotated = dirty.annotate(Job.objects.filter(id=j.id)).get()
        assert annotated.dirty_evaluation == engine.summary(j)["evaluationStatus"]


def test_member_removal_costs_the_same_statements_for_10_or_60_jobs(engine):
    """Bounded: a member loss is a constant number of statements, whatever the job count."""
    hosts = [engine.add_member(slots=80) for _ in range(2)]

    def removal_statements(jobs: int) -> int:
        for _ in range(jobs):
            engine.submit(threshold=3)
        engine.schedule()
        engine.run_deployed()
        victim = engine.add_member(slots=0)
        with CaptureQueriesContext(connection) as ctx:
            engine.lose(victim)
        return len(ctx.captured_queries)

    few = removal_statements(10)
    many = removal_statements(50)
    assert few == many
    # Every job handled every event: the shared watermark is up to date and no job has a gap.
    assert not DirtyTrackingGap.objects.exists()
    for job_id in DirtyJobState.objects.values_list("job_id", flat=True):
        assert not dirty.Sequences.read(job_id).lagging
    # Affected jobs too: losing a host of dozens of jobs is still one batch.
    affected = set(
        TaskGroup.objects.filter(member=hosts[0], status="RUNNING").values_list("job_id", flat=True)
    )
    assert len(affected) >= 30
    with CaptureQueriesContext(connection) as ctx:
        engine.lose(hosts[0])
    assert len(ctx.captured_queries) <= few + 10
    assert set(MemberLossIncident.objects.values_list("job_id", flat=True)) == affected


def test_a_failed_history_snapshot_keeps_dirty_and_is_written_later(engine):
    """The job's end is never blocked, DIRTY is never lost: the running state stays until the
    reconciliation writes the snapshot."""
    job, _ = running_job(engine, threshold=1)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    running = engine.summary(job)
    assert running["evaluationStatus"] == "DIRTY"
    with history_fault():
        engine.cancel(job)
        assert Job.objects.get(id=job.id).status == "CANCELED"
        assert not JobHistory.objects.filter(job=job).exists()
        finished = engine.summary(job)
        assert finished["dirty"] and finished["recoveryAttemptCount"] == 1
        assert dirty.annotate(Job.objects.filter(id=job.id)).get().dirty_evaluation == "DIRTY"
        # Surfaced, by the record and by the tracker, whose gap says why it is incomplete.
        assert kinds(job, "job.history-failed") == kinds(job, "dirty.tracker-failed") == 1
        assert "history snapshot" in finished["incompleteReason"]
    engine.new_master()
    assert JobHistory.objects.get(job=job).dirty_task["dirty"] is True
    assert not DirtyJobState.objects.filter(job_id=job.id).exists()
    assert engine.summary(job) == {**running, "activeEpisodeId": None}


def redeployed_unconfirmed(engine, fault, threshold: int = 1):
    """A running job whose lost pipelines redeployed while their confirmations failed (the
    fault stays on): attempts PREPARED, repairable gaps, the deployment not counted yet."""
    job, _ = running_job(engine, threshold=threshold)
    engine.lose(host_of_both_pipelines(engine, job))
    engine.fail_lost()
    engine.stop_failing()
    fault.on(job, "engine_recoveryattempt")
    assert engine.restore_due() == ["restored", "restored"]
    engine.run_deployed()
    assert engine.running(job) and {s for _, s in attempts(job)} == {"PREPARED"}
    return job


def test_an_ended_jobs_deployment_is_confirmed_before_its_gaps_go_and_its_record_is_written(
    engine, fault
):
    """The job ended while its confirmations failed, and its record failed with them: the
    next master confirms the deployment first, and its gaps stay until the record is written
    (they went first, and the job read CLEAN with the deployment uncounted)."""
    job = redeployed_unconfirmed(engine, fault, threshold=2)
    engine.cancel(job)
    assert not JobHistory.objects.filter(job=job).exists()
    assert engine.summary(job)["evaluationStatus"] == "UNKNOWN"
    fault.off()
    with history_fault():
        engine.new_master()  # confirms; the record fails again
        s = engine.summary(job)
        assert (s["evaluationStatus"], s["recoveryAttemptCount"], s["trackingComplete"]) == (
            "UNKNOWN",
            1,
            False,
        ), s
    engine.new_master()
    record = JobHistory.objects.get(job=job)
    s = record.dirty_task
    assert (s["evaluationStatus"], s["recoveryAttemptCount"], s["trackingComplete"]) == (
        "CLEAN",
        1,
        True,
    ), s
    assert {a["state"] for a in record.episodes[0]["attempts"]} == {"CONFIRMED"}
    assert not DirtyJobState.objects.filter(job_id=job.id).exists()
    assert not DirtyTrackingGap.objects.filter(job=job).exists()


def test_a_job_ending_before_its_confirmation_is_repaired_records_the_deployment(engine, fault):
    """The job ends before any reconciliation: its record confirms the deployment itself
    before taking the summary (it read UNKNOWN for ever, the deployment uncounted)."""
    job = redeployed_unconfirmed(engine, fault, threshold=2)
    fault.off()
    engine.cancel(job)
    s = JobHistory.objects.get(job=job).dirty_task
    assert (s["evaluationStatus"], s["recoveryAttemptCount"], s["trackingComplete"]) == (
        "CLEAN",
        1,
        True,
    ), s
    assert kinds(job, "dirty.repaired") == 1


def test_a_member_event_nobody_handled_becomes_gaps_of_the_jobs_of_that_time(engine):
    """The shared watermark left behind (an older master ended a member without the tracker):
    the jobs tracked then are UNKNOWN for ever; jobs submitted afterwards are not."""
    job, _ = running_job(engine)
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE engine_clusterstate SET member_event_sequence = member_event_sequence + 1"
        )
    assert engine.summary(job)["evaluationStatus"] == "UNKNOWN"
    engine.new_master()
    assert engine.summary(job)["evaluationStatus"] == "UNKNOWN"
    later = engine.submit(threshold=2)
    assert engine.summary(later)["evaluationStatus"] == "CLEAN"
    assert dirty.annotate(Job.objects.filter(id=job.id)).get().dirty_evaluation == "UNKNOWN"
    assert dirty.annotate(Job.objects.filter(id=later.id)).get().dirty_evaluation == "CLEAN"
    assert kinds_without_job("dirty.tracker-failed") == 1


def test_a_missed_member_event_gaps_only_the_jobs_that_existed_at_it(engine):
    """Two member events nobody handled (an older master ended two members, leaving the shared
    watermark behind), with jobs submitted before, between and after them: each job gets a gap
    at the first missed event it existed at, and a job submitted after both gets none."""
    before, _ = running_job(engine)
    pruned = engine.submit(threshold=2)  # its submission event is gone: taken as existing
    EngineEvent.objects.filter(job_id=pruned.id, kind="job.submitted").delete()
    first = dirty.Sequences.read(before.id).member_event + 1
    engine.lose(engine.add_member(slots=0))
    with connection.cursor() as cur:  # as if the tracker had never run for that event
        cur.execute("UPDATE engine_clusterstate SET dirty_handled_sequence = %s", [first - 1])
    between = engine.submit(threshold=2)
    engine.lose(engine.add_member(slots=0))  # the watermark, behind, stays behind
    after = engine.submit(threshold=2)
    assert engine.summary(after)["evaluationStatus"] == "UNKNOWN"  # not repaired yet
    engine.new_master()
    gaps = dict(DirtyTrackingGap.objects.values_list("job_id", "member_event_sequence"))
    assert gaps == {before.id: first, pruned.id: first, between.id: first + 1}
    for job in (before, pruned, between):
        s = engine.summary(job)
        assert s["evaluationStatus"] == "UNKNOWN" and not s["trackingComplete"], s
        assert dirty.annotate(Job.objects.filter(id=job.id)).get().dirty_evaluation == "UNKNOWN"
    assert engine.summary(after)["evaluationStatus"] == "CLEAN"
    assert engine.summary(after)["trackingComplete"]
    assert dirty.annotate(Job.objects.filter(id=after.id)).get().dirty_evaluation == "CLEAN"
    [failed] = EngineEvent.objects.filter(job_id__isnull=True, kind="dirty.tracker-failed")
    assert failed.payload["jobs"] == 3


def kinds_without_job(kind: str) -> int:
    return EngineEvent.objects.filter(job_id__isnull=True, kind=kind).count()


def test_one_job_failing_reconciliation_does_not_stop_the_others(engine, fault):
    first, _ = running_job(engine, members=2)
    second = engine.submit(threshold=2)  # on the same two members
    engine.schedule()
    engine.run_deployed()
    for _ in range(3):
        engine.add_member()
    victim = host_of_both_pipelines(engine, first)
    assert victim.id in engine.members_of(second)
    engine.lose(victim)
    engine.fail_lost()
    engine.stop_failing()
    fault.on(first, "engine_recoveryattempt")
    fault.on(second, "engine_recoveryattempt")
    engine.restore_due()  # both confirmations fail: both jobs have PREPARED attempts
    fault.off()
    fault.on(first, "engine_recoveryattempt")  # the first keeps failing
    engine.new_master()
    assert {s for _, s in attempts(second)} == {"CONFIRMED"}
    assert {s for _, s in attempts(first)} == {"PREPARED"}
    assert engine.summary(first)["evaluationStatus"] == "UNKNOWN"
    fault.off()
    engine.new_master()
    engine.run_deployed()
    engine.new_master()
    for job in (first, second):
        s = engine.summary(job)
        assert s["evaluationStatus"] == "CLEAN", s
        assert s["recoveryAttemptCount"] == 1
