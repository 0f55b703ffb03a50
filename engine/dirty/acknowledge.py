"""An operator's acknowledgement of a job whose recovery tracking reads UNKNOWN.

UNKNOWN says the tracker cannot vouch for the count (a member event it missed, a failure it
contained). An operator who has checked the job may acknowledge it: they accept that its count
cannot be verified. That does not make it verified, so nothing of the tracking changes: its
gaps stay, it keeps reading UNKNOWN (``trackingComplete: false``, never listed as CLEAN), and
its summary gains who, when and why (``acknowledgedBy``, ``acknowledgedAt``,
``acknowledgedReason``), with a ``dirty.acknowledged`` event. Acknowledging again replaces them
(each one has its event). A finished job's frozen summary is acknowledged the same way.
"""

from __future__ import annotations

from django.db import connection, transaction
from django.db.models.functions import Now

from engine.dirty import events as dirty_events
from engine.dirty.reading import Sequences, acknowledgement, evaluate, summary
from engine.dirty.tracking import SCHEMA_VERSION, lock_state
from engine.events import append_events
from engine.models import DirtyJobState, Job
from engine.states import JOB_TERMINAL, DirtyEvaluation
from history.models import JobHistory


class AcknowledgementRefused(Exception):
    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


def acknowledge(job_id: int, user, reason: str) -> dict:
    """Acknowledge the job's UNKNOWN evaluation; returns its new ``dirtyTask`` summary."""
    reason = (reason or "").strip()
    if not reason:
        raise AcknowledgementRefused("reason: say what was checked (it is audited)", 400)
    by = user.get_username()
    with transaction.atomic():
        job = Job.objects.select_for_update(no_key=True).filter(id=job_id).first()
        if job is None:
            raise AcknowledgementRefused(f"no job {job_id}", 404)
        if job.dirty_threshold <= 0:
            raise AcknowledgementRefused(f"job {job_id} does not track its recovery")
        record = None
        if job.status in JOB_TERMINAL:
            record = JobHistory.objects.select_for_update().filter(job_id=job_id).first()
        if record is not None and record.dirty_task:
            return _finished(job, record, by, reason)
        return _running(job, by, reason)


def _event(job: Job, by: str, reason: str, was: str | None, now: str) -> None:
    append_events(
        [
            dirty_events.acknowledged(
                job.id, by=by, reason=reason, previous_reason=was, evaluation=now
            )
        ]
    )


def _running(job: Job, by: str, reason: str) -> dict:
    state = lock_state(job.id)
    if state is None:
        raise AcknowledgementRefused(
            f"job {job.id} has no dirty-job state: there are no counts to evaluate it from"
        )
    if state.schema_version > SCHEMA_VERSION:
        raise AcknowledgementRefused(
            f"job {job.id}'s dirty state has layout {state.schema_version}, newer than this "
            "engine's: upgrade before acknowledging it"
        )
    before = Sequences.read(job.id)
    evaluation = evaluate(state, before)
    if evaluation != DirtyEvaluation.UNKNOWN:
        raise AcknowledgementRefused(f"job {job.id} reads {evaluation}: nothing to acknowledge")
    if before.handled < before.member_event:
        raise AcknowledgementRefused(
            f"member event {before.handled + 1} is still being handled by the master: "
            "acknowledge again in a few seconds"
        )
    was = summary(job, state, before)["incompleteReason"]
    DirtyJobState.objects.filter(job_id=job.id).update(
        acknowledged_by=by,
        acknowledged_at=Now(),
        acknowledged_reason=reason[:500],
        updated_at=Now(),
    )
    state.refresh_from_db()
    after = summary(job, state, Sequences.read(job.id))
    _event(job, by, reason, was, after["evaluationStatus"])
    return after


def _finished(job: Job, record: JobHistory, by: str, reason: str) -> dict:
    snapshot = record.dirty_task
    if snapshot.get("evaluationStatus") != DirtyEvaluation.UNKNOWN:
        raise AcknowledgementRefused(
            f"job {job.id} reads {snapshot.get('evaluationStatus')}: nothing to acknowledge"
        )
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        now = cur.fetchone()[0]
    after = {**snapshot, **acknowledgement(by, now, reason[:500])}
    JobHistory.objects.filter(job_id=job.id).update(dirty_task=after)
    _event(job, by, reason, snapshot.get("incompleteReason"), after["evaluationStatus"])
    return after
