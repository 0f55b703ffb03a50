"""What the tracker's modules share: options, the leave classification, the job state row's
lock, and how a failure is contained (a gap that keeps the job from reading CLEAN, and a
``dirty.tracker-failed`` event)."""

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
