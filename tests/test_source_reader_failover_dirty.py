"""A reader restored alone is a deployment attempt caused by member loss, tracked as a pipeline
restore is (engine.dirty): prepared when its step is created, confirmed and counted when the
reader reaches DEPLOYING, under the pipeline's restore numbering; its episode completes once the
reader runs again. While it waits (for its due time or for a slot) the pipeline stays RUNNING:
the master's reconciliation keeps its attempt and the pending-incident TTL keeps its episode. A
withdrawn reader restore hands its attempt to the whole pipeline's, or aborts it."""

from __future__ import annotations

import pytest

from engine import dirty
from engine.master import orchestration
from engine.models import RecoveryAttempt, RecoveryEpisode
from tests.dirtykit import attempts
from tests.test_source_reader_failover_rollup import host, lane_a, pipeline, running

__all__ = ["lane_a"]

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_reader_restore_counts_one_attempt_and_its_episode_ends_once_it_runs(engine, lane_a):
    job = running(engine)
    engine.lose(host(job, "READER", 0))
    engine.fail_lost()
    (attempt,) = RecoveryAttempt.objects.filter(job=job)
    assert (attempt.restore_number, attempt.state) == (1, "PREPARED")
    assert attempt.attempt_id == f"{attempt.episode_id}-1-1"

    assert engine.restore_due() == ["restored"]  # the reader is DEPLOYING
    assert attempts(job) == [(attempt.attempt_id, "CONFIRMED")]
    assert engine.summary(job)["recoveryAttemptCount"] == 1
    orchestration.reconcile(engine.epoch)  # a settle of the job: nothing runs again yet
    assert RecoveryEpisode.objects.get(job=job).status == "ACTIVE"

    engine.run_deployed()
    assert RecoveryEpisode.objects.get(job=job).status == "COMPLETED"
    summary = engine.summary(job)
    assert (summary["recoveryAttemptCount"], summary["evaluationStatus"]) == (1, "CLEAN")


def test_a_pending_reader_restore_keeps_its_attempt_and_its_episode(engine, lane_a, settings):
    """Waiting for a slot past the pending-incident TTL, under a new master that reconciles:
    the attempt stays PREPARED (not unexplained: the job does not read UNKNOWN), the episode
    stays ACTIVE, and both are settled once the reader deploys."""
    settings.ENGINE = {**settings.ENGINE, "dirty-task.pending-incident-ttl": 0.0}
    job = running(engine, spare=0)
    engine.lose(host(job, "READER", 0))
    engine.fail_lost()
    assert engine.restore_due() == ["waiting for slots"]
    assert pipeline(job).status == "RUNNING"

    engine.new_master()
    assert not dirty.expire_stale_episodes(engine.epoch)
    assert {state for _, state in attempts(job)} == {"PREPARED"}
    assert RecoveryEpisode.objects.get(job=job).status == "ACTIVE"
    assert engine.summary(job)["evaluationStatus"] == "CLEAN"

    engine.add_member(slots=1)
    engine.settle()
    assert {state for _, state in attempts(job)} == {"CONFIRMED"}
    assert RecoveryEpisode.objects.get(job=job).status == "COMPLETED"
    assert engine.summary(job)["recoveryAttemptCount"] == 1


def test_a_withdrawn_reader_restore_hands_its_attempt_to_the_whole_pipeline(engine, lane_a):
    job = running(engine, spare=3)
    engine.lose(host(job, "READER", 0))
    engine.fail_lost()
    (prepared,) = attempts(job)
    engine.lose(host(job, "ENUMERATOR"))  # a second loss of the same episode
    engine.settle()
    assert engine.running(job) and pipeline(job).restore_count == 1
    assert attempts(job) == [(prepared[0], "CONFIRMED")]
    summary = engine.summary(job)
    assert (summary["recoveryAttemptCount"], summary["evaluationStatus"]) == (1, "CLEAN")
    assert RecoveryEpisode.objects.get(job=job).status == "COMPLETED"


def test_a_reader_restore_withdrawn_as_its_job_fails_aborts_its_attempt(engine, lane_a):
    job = running(engine)
    engine.lose(host(job, "READER", 0))
    engine.fail_lost()
    engine.ordinary_failure(job)  # the other reader fails on its own
    (attempt,) = attempts(job)
    assert attempt[1] == "ABORTED"
    engine.stop_failing()
    assert engine.summary(job)["evaluationStatus"] == "CLEAN"
