"""The active master's reconciliation: PREPARED attempts explained by their pipelines,
recovered episodes completed, repairable gaps repaired, missed member events turned into gaps."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import connection
from django.db.models.functions import Now

from engine.dirty import events as dirty_events
from engine.dirty.attempts import confirm, deployed_unconfirmed
from engine.dirty.episodes import after_settle
from engine.dirty.tracking import incomplete, lock_state, record_gap
from engine.events import append_events
from engine.fencing import StaleEpoch, fenced
from engine.models import (
    ClusterState,
    ControlStep,
    DirtyJobState,
    DirtyTrackingGap,
    Job,
    RecoveryAttempt,
    RecoveryEpisode,
)
from engine.states import (
    EXECUTION_TERMINAL,
    JOB_TERMINAL,
    AttemptState,
    ControlStepKind,
    ControlStepState,
    EpisodeStatus,
    ExecutionStatus,
)

log = logging.getLogger("keel.dirty")


def reconcile(epoch: int, settled_for: float = 0.0) -> int:
    """The active master's reconciliation: once per epoch before it schedules anything, then as
    housekeeping. Explains every PREPARED attempt of a job by its pipeline's state; returns how
    many attempts changed state. ``settled_for``: only attempts prepared, and episodes last
    active, at least that many seconds ago (housekeeping repairs what the normal path left
    behind; in a storm it would otherwise lock every recovering job, one transaction each,
    while their restores wait for the same rows).

    - the pipeline got the deployment of that restore (its restore count reached it): confirm
      the original attempt id (a no-op if it was confirmed), whatever happened since;
    - it still waits for that restore: keep the binding, normal deployment confirms it;
    - it ended without that deployment: abort the attempt;
    - anything else is unexplained: the job becomes UNKNOWN.
    Then it completes episodes whose recovery finished unnoticed, removes repairable gaps that
    are repaired, and turns a member event the tracker could not handle at all into gaps of the
    jobs it concerned. One job's failure is contained (and recorded); only a stale epoch stops
    it. (Finished-job records that failed are retried by engine.jobs.terminal, after this.)

    An ended job whose record is still to be written has its attempts explained too (its
    deployments confirmed, so counted), while its gaps stay until that record is written.
    """
    changed = 0
    settled = Now() - timedelta(seconds=settled_for)
    prepared = list(
        RecoveryAttempt.objects.filter(state=AttemptState.PREPARED, prepared_at__lte=settled)
        .order_by("job_id", "id")
        .values_list("id", "job_id")
    )
    for attempt_id, job_id in prepared:
        changed += _per_job(epoch, job_id, "reconciliation", _reconcile_attempt, attempt_id)
    for job_id in (
        RecoveryEpisode.objects.filter(status=EpisodeStatus.ACTIVE, last_activity_at__lte=settled)
        .exclude(job__status__in=JOB_TERMINAL)
        .order_by("job_id")
        .values_list("job_id", flat=True)
    ):
        _per_job(epoch, job_id, "episode completion", _complete_if_recovered)
    for job_id in sorted(
        set(DirtyTrackingGap.objects.filter(repairable=True).values_list("job_id", flat=True))
    ):
        _per_job(epoch, job_id, "gap repair", _repair_gaps)
    try:
        _repair_watermark(epoch)
    except StaleEpoch:
        raise
    except Exception:
        log.exception("dirty-job watermark repair failed; it is retried")
    return changed


def _per_job(epoch: int, job_id: int, where: str, step, *args) -> int:
    """Run ``step(job, epoch, *args)`` in one fenced transaction with the job row locked; a
    failure is logged, recorded as a gap and skipped (a stale epoch propagates)."""

    try:
        with fenced(epoch):
            job = Job.objects.select_for_update(no_key=True).filter(id=job_id).first()
            if job is None:
                return 0
            changed, events = step(job, epoch, *args)
            append_events(events)
            return changed
    except StaleEpoch:
        raise
    except Exception as exc:
        log.exception("dirty-job %s of job %s failed", where, job_id)
        record_gap(job_id, f"{where} failed: {exc}", repairable=True)
        return 0


def _reconcile_attempt(job: Job, epoch: int, attempt_id: int):
    state = lock_state(job.id)
    attempt = RecoveryAttempt.objects.select_related("pipeline").filter(id=attempt_id).first()
    if state is None or attempt is None or attempt.state != AttemptState.PREPARED:
        return 0, []
    p = attempt.pipeline
    if p.restore_count >= attempt.restore_number:
        return 1, confirm(state, attempt, epoch)
    if p.restore_count == attempt.restore_number - 1 and (
        p.status == ExecutionStatus.FAILING or _reader_restore_pending(attempt)
    ):
        return 0, []
    if p.status in EXECUTION_TERMINAL or job.status in JOB_TERMINAL:
        RecoveryAttempt.objects.filter(id=attempt.id).update(
            state=AttemptState.ABORTED, ended_at=Now()
        )
        return 1, [
            dirty_events.attempt_aborted(
                job.id,
                epoch,
                attempt.attempt_id,
                p.index,
                attempt.restore_number,
                f"pipeline {p.index} ended {p.status} without that deployment",
            )
        ]
    return 1, incomplete(
        state,
        epoch,
        f"attempt {attempt.attempt_id} is PREPARED but pipeline {p.index} is {p.status} after "
        f"{p.restore_count} restore(s)",
    )


def _reader_restore_pending(attempt: RecoveryAttempt) -> bool:
    """Its restore redeploys some readers of a running pipeline, and has not run yet."""
    return ControlStep.objects.filter(
        job_id=attempt.job_id,
        kind=ControlStepKind.RESTORE_READERS,
        state=ControlStepState.PENDING,
        payload__pipelineId=attempt.pipeline_id,
        payload__restore=attempt.restore_number,
    ).exists()


def _complete_if_recovered(job: Job, epoch: int):
    return 0, after_settle(job, list(job.pipelines.order_by("index")), epoch)


def _repair_gaps(job: Job, epoch: int):
    """Repairable gaps go once nothing is left to redo: every attempt whose deployment happened
    is confirmed, and a recovered episode is completed (both done just before, in order). An
    ended job's go with its finished-job record, which redoes the rest first
    (engine.dirty.history); once that is written, any left are moot."""
    if job.status not in JOB_TERMINAL:
        if deployed_unconfirmed(job.id).exists():
            return 0, []
        _, events = _complete_if_recovered(job, epoch)
    elif DirtyJobState.objects.filter(job_id=job.id).exists():
        return 0, []  # its record is still to be written
    else:
        events = []
    removed, _ = DirtyTrackingGap.objects.filter(job=job, repairable=True).delete()
    if removed:
        events.append(dirty_events.repaired(job.id, epoch, removed))
    return removed, events


#: The permanent gaps of missed member events ``first..last``, for the jobs that existed at
#: one of them: a job gets a gap at the first missed event whose own event (``member.removed``
#: or ``member.left``) committed after the job's ``job.submitted``. The event store's ``seq``
#: is the commit order (engine.events), and a job a member event could concern had committed
#: its submission before that event's transaction scanned the jobs, hence before it appended
#: its event. Where either event is gone (retention), the job is taken to have existed.
_MISSED_EVENT_GAPS = """
WITH missed AS (
    SELECT k.n, e.seq
      FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS k(n)
      LEFT JOIN (SELECT (payload->>'memberEventSequence')::bigint AS n, min(seq) AS seq
                   FROM engine_engineevent
                  WHERE kind IN ('member.removed', 'member.left')
                    AND (payload->>'memberEventSequence')::bigint
                        BETWEEN %(first)s::bigint AND %(last)s::bigint
                  GROUP BY 1) e ON e.n = k.n
), tracked AS (
    SELECT s.job_id,
           (SELECT min(e.seq) FROM engine_engineevent e
             WHERE e.job_id = s.job_id AND e.kind = 'job.submitted') AS submitted
      FROM engine_dirtyjobstate s
)
INSERT INTO engine_dirtytrackinggap (job_id, member_event_sequence, repairable, reason, at)
SELECT t.job_id, min(m.n), false, 'member event ' || min(m.n) || ' was not handled', now()
  FROM tracked t
  JOIN missed m ON t.submitted IS NULL OR m.seq IS NULL OR t.submitted < m.seq
 GROUP BY t.job_id
"""


def _repair_watermark(epoch: int) -> None:
    """A member event the tracker could not handle at all (not even a gap could be written, or
    a member of an older protocol ended it) leaves the shared watermark behind, which would keep
    every job UNKNOWN for ever, even jobs submitted later. Turn it into permanent gaps of the
    jobs that existed at the missed events (_MISSED_EVENT_GAPS: a superset of those they
    concerned, never a job submitted after them) and catch the watermark up."""

    with fenced(epoch):
        row = (
            ClusterState.objects.select_for_update(no_key=True)
            .filter(id=1)
            .values_list("member_event_sequence", "dirty_handled_sequence")
            .first()
        )
        if row is None or row[1] >= row[0]:
            return
        sequence, handled = row
        with connection.cursor() as cur:
            cur.execute(_MISSED_EVENT_GAPS, {"first": handled + 1, "last": sequence})
            gaps = cur.rowcount
        ClusterState.objects.filter(id=1).update(dirty_handled_sequence=sequence)
        log.error(
            "dirty-job tracking missed member events %s..%s: %s jobs are UNKNOWN from now on",
            handled + 1,
            sequence,
            gaps,
        )
        append_events(
            dirty_events.tracker_failed(
                [],
                epoch,
                "member-event watermark",
                f"member events {handled + 1}..{sequence} were not handled",
                jobs=gaps,
            )
        )
