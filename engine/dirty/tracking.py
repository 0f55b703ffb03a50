"""Dirty-job (recovery-degraded) tracking: seed 000, phase 1 (docs/decisions/0007-dirty-jobs.md).

A job that enables ``job.dirty-task.threshold`` (> 0) is labelled DIRTY once the number of
job-level deployment attempts caused by member loss reaches the threshold. The label is extra
metadata: the job's status and its retries never change because of it.

Vocabulary (the seed's):
- member-loss incident: one member (by UUID) left and affected one job; idempotent by
  ``(job, lostMemberUuid)``. Registered in the very transaction that ends the membership,
  before the master fails the member's task groups;
- recovery episode: one continuous recovery; it completes when every pipeline of the job runs
  again with every prepared attempt confirmed, aborts when the job ends first or it goes stale;
- deployment attempt ``<episodeId>-<pipelineId>-<prepareSequence>``: allocated when a restore is
  prepared (engine.lifecycle requests it), confirmed when the pipeline reaches DEPLOYING on its
  new slots (engine.recovery). prepareSequence counts per pipeline within the episode;
- generation: the highest confirmed prepareSequence of the episode. ``recoveryAttemptCount``
  rises only when the generation advances: one loss hitting three pipelines counts 1.

Exactness: every change to a job's state takes its row lock, inside the transaction of the state
change it follows (so they commit or vanish together), and appends its EngineEvent there. The
global member-event sequence is bumped before the jobs are scanned. After the event is handled,
every job's watermark advances in one statement: the jobs share one watermark,
``ClusterState.dirty_handled_sequence`` (moved only from ``sequence - 1`` to ``sequence``), and a
job that could not handle an event gets a DirtyTrackingGap row, which freezes its own watermark
just before that event for ever. So a member event costs O(affected jobs), not O(jobs), and a
lagging or missing watermark reads UNKNOWN, never CLEAN. Tracker failures are caught in
savepoints, logged and recorded as ``dirty.tracker-failed`` events: they never block the member
removal, the restore or the job's end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from engine.dirty import events as dirty_events
from engine.models import (
    DirtyJobState,
    DirtyTrackingGap,
    EngineEvent,
    Job,
    Member,
)
from engine.states import LeaveClassification

log = logging.getLogger("keel.dirty")

#: The DirtyJobState layout this code reads; a newer row evaluates UNKNOWN.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Options:
    history_size: int
    pending_incident_ttl: float  # seconds


def options() -> Options:
    engine = settings.ENGINE
    return Options(
        history_size=int(engine["dirty-task.event-history-size"]),
        pending_incident_ttl=float(engine["dirty-task.pending-incident-ttl"]),
    )


def classify_leave(member: Member) -> str:
    """The cause classification of a member loss. A member's own shutdown is never trusted to
    classify itself (a SIGTERM'd pod is as unexplained as a crash): always UNCLASSIFIED."""
    return LeaveClassification.UNCLASSIFIED


def tracker_failed(job_ids: Iterable[int], epoch: int | None, where: str, exc: BaseException):
    """Log and surface a tracker failure (the caller's savepoint rolled its writes back): one
    ``dirty.tracker-failed`` event per job, or one without a job for a cluster-wide step."""
    job_ids = list(job_ids)
    log.error("dirty-job tracking failed (%s) for jobs %s: %s", where, job_ids, exc)
    return dirty_events.tracker_failed(job_ids, epoch, where, str(exc))


def record_gap(
    job_id: int, reason: str, sequence: int | None = None, repairable: bool = False
) -> bool:
    """The job cannot be reported CLEAN until this is repaired (or ever, for a missed member
    event). Its own savepoint, no lock on any job row; a failure is logged and returns False."""
    try:
        with transaction.atomic():
            DirtyTrackingGap.objects.create(
                job_id=job_id,
                member_event_sequence=sequence,
                repairable=repairable,
                reason=reason[:1000],
            )
        return True
    except Exception:
        log.exception("could not record a dirty-tracking gap for job %s", job_id)
        return False


def contained(job: Job, epoch: int | None, where: str, exc: Exception, repairable: bool):
    """A tracker entry point failed: surface it and record the gap; the engine goes on."""
    record_gap(job.id, f"{where} failed: {exc}", repairable=repairable)
    return tracker_failed([job.id], epoch, where, exc)


def init_state(job: Job) -> None:
    """Create the state of an enabled job, in its submit transaction (before it is schedulable).

    A job that is not committed yet has no task group anywhere, so no member event being handled
    meanwhile can concern it: it starts at the shared watermark."""
    if job.dirty_threshold <= 0:
        return
    DirtyJobState.objects.create(job=job, threshold=job.dirty_threshold)


def lock_state(job_id: int) -> DirtyJobState | None:
    return DirtyJobState.objects.select_for_update(no_key=True).filter(job_id=job_id).first()


def incomplete(state: DirtyJobState, epoch: int | None, reason: str) -> list[EngineEvent]:
    """Something happened that the tracker cannot explain: a permanent gap, so the job is
    UNKNOWN from now on."""
    log.warning("dirty-job tracking of job %s incomplete: %s", state.job_id, reason)
    record_gap(state.job_id, reason)
    return [dirty_events.tracking_incomplete(state.job_id, epoch, reason)]
