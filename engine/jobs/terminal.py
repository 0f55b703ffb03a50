"""Job status transitions, and the one place a job ends.

``end_job`` is the terminal transition, whatever ends the job: its last task group finishing, a
failure, or a cancel before anything ran. It ends what of the job was never placed (pipelines
and task groups, each with its event), walks the job to its terminal status one valid
transition at a time (an event each), and writes the finished-job record, asking each
contributor for its part. The caller holds the job row's lock and appends the events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db import transaction
from django.db.models.functions import Now

from engine import counters, dirty
from engine import events as builders
from engine.events import append_events
from engine.fencing import StaleEpoch, fenced
from engine.jobs import checkpoint_history, cleanup, summary
from engine.models import EngineEvent, Job, TaskGroup
from engine.states import (
    EXECUTION_TERMINAL,
    EXECUTION_TRANSITIONS,
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    ExecutionStatus,
    InvalidTransition,
    JobStatus,
    check_transition,
    transition_path,
)
from history.contributions import HistoryPart
from history.models import JobHistory

log = logging.getLogger("keel.terminal")

#: The status that a job's still-live pipelines and task groups end in when the job ends.
_LEFTOVER_END = {
    JobStatus.FINISHED: ExecutionStatus.FINISHED,
    JobStatus.FAILED: ExecutionStatus.FAILED,
    JobStatus.CANCELED: ExecutionStatus.CANCELED,
}


@dataclass(frozen=True)
class HistoryContributor:
    """A part of the engine with something to say in a finished job's record."""

    #: Its part of the record of ``job`` (in the record's transaction; may raise).
    part: Callable[[Job, int | None], HistoryPart]
    #: The record failed: what the contributor records of that (events; its own savepoints).
    failed: Callable[[Job, int | None, Exception], list[EngineEvent]]
    #: Ended jobs whose part is not recorded yet (a failed record is retried for them).
    pending: Callable[[], Iterable[int]]


HISTORY_CONTRIBUTORS = (
    HistoryContributor(summary.history_part, summary.history_failed, summary.pending_history),
    HistoryContributor(dirty.history_part, dirty.history_failed, dirty.pending_history),
)


def advance_job(job: Job, target: str, epoch: int | None = None) -> list[EngineEvent]:
    """Walk ``job`` to ``target`` one valid transition at a time, an event each (the caller
    saves). A failing job's events carry its errorMsg."""
    events = []
    for step in transition_path(JOB_TRANSITIONS, job.status, target):
        failing = step in (JobStatus.FAILING, JobStatus.FAILED)
        error_msg = job.error_msg if failing else None
        events.append(
            builders.job_status(job.id, job.status, step, epoch=epoch, error_msg=error_msg)
        )
        job.status = step
    return events


def end_job(job: Job, status: str, epoch: int | None = None) -> list[EngineEvent]:
    """The terminal transition (FINISHED, FAILED or CANCELED): see the module docstring."""
    if status not in JOB_TERMINAL:
        raise ValueError(f"{status} is not a terminal job status")
    ending = job.status not in JOB_TERMINAL
    events = _end_leftovers(job, _LEFTOVER_END[status], epoch)
    events += advance_job(job, status, epoch)
    if ending:  # the transition itself, counted once (the job row is locked by the caller)
        counters.bump([(counters.JOBS_ENDED, str(status), 1)])
    job.finished_at = Now()
    job.save(update_fields=["status", "error_msg", "finished_at"])
    job.refresh_from_db(fields=["finished_at"])
    events += _fail_open_checkpoints(job, epoch)
    events += record_history(job, epoch)
    # The tombstone is the job row's terminal status (running lists and counts, and a new
    # master's reconcile, look only at live statuses); the cleanup intent is a row, here.
    cleanup.record_job_state_cleanup(job)
    return events


def _fail_open_checkpoints(job: Job, epoch: int | None) -> list[EngineEvent]:
    """A checkpoint still PENDING when its job ends can never complete: it ends FAILED now, so
    the history's checkpoint counts are final, and is recorded in the job's checkpoint
    history."""
    from django.db.models import F

    from engine.models import Checkpoint, Pipeline
    from engine.states import CheckpointState

    events, ended = [], []
    pending = list(
        Checkpoint.objects.filter(job=job, state=CheckpointState.PENDING).select_related("pipeline")
    )
    if pending:
        # The pipelines first, in id order: the lock order of the master's checkpoint ends.
        list(
            Pipeline.objects.select_for_update(no_key=True)
            .filter(id__in={c.pipeline_id for c in pending})
            .order_by("id")
            .values_list("id", flat=True)
        )
    for checkpoint in pending:
        reason = f"job {job.status} before every ack"
        updated = Checkpoint.objects.filter(id=checkpoint.id, state=CheckpointState.PENDING).update(
            state=CheckpointState.FAILED, ended_at=Now(), failure_reason=reason
        )
        if not updated:
            continue  # the master ended it meanwhile
        ended.append(checkpoint)
        Pipeline.objects.filter(id=checkpoint.pipeline_id).update(
            checkpoints_failed=F("checkpoints_failed") + 1
        )
        events.append(
            builders.checkpoint_ended(
                job.id,
                epoch,
                checkpoint.id,
                checkpoint.pipeline.index,
                CheckpointState.FAILED,
                reason,
            )
        )
    checkpoint_history.record(ended)
    return events


def _end_leftovers(job: Job, status: str, epoch: int | None) -> list[EngineEvent]:
    """End the job's pipelines and task groups that were never placed (a job cancelled before it
    was scheduled has nothing else), each with its event. One that was placed ends by its own
    report, or as lost with its member, before the roll-up ends the job: finding one here is a
    bug, and the transition is refused."""
    events = []
    groups = list(TaskGroup.objects.filter(job=job).live().order_by("pipeline_id", "kind", "index"))
    pipelines = list(job.pipelines.exclude(status__in=EXECUTION_TERMINAL).order_by("index"))
    placed = [g for g in groups if g.status != ExecutionStatus.CREATED]
    placed += [p for p in pipelines if p.status != ExecutionStatus.CREATED]
    if placed:
        raise InvalidTransition(f"job {job.id} cannot end {status} while {placed[0]} is live")
    for pipeline in pipelines:
        check_transition(EXECUTION_TRANSITIONS, pipeline.status, status)
        events.append(
            builders.pipeline_status(job.id, pipeline.index, pipeline.status, status, epoch=epoch)
        )
    for group in groups:
        check_transition(EXECUTION_TRANSITIONS, group.status, status)
        events.append(
            builders.taskgroup_status(
                job.id, group.id, group.attempt, group.status, status, epoch=epoch
            )
        )
    job.pipelines.filter(id__in=[p.id for p in pipelines]).update(status=status)
    TaskGroup.objects.filter(id__in=[g.id for g in groups]).update(status=status, updated_at=Now())
    return events


def record_history(job: Job, epoch: int | None = None, *, strict: bool = False):
    """Write the finished-job record with every contributor's part, in a savepoint of the
    terminal transaction. A failure never blocks the job's end: it is logged and surfaced
    (``job.history-failed``, and what each contributor records of it), the contributors keep
    their running state, and ``record_pending_history`` retries the jobs they still hold
    (``strict``: raise instead, for that retry's own containment)."""
    try:
        with transaction.atomic():
            fields: dict = {"status": job.status}
            events: list[EngineEvent] = []
            for contributor in HISTORY_CONTRIBUTORS:
                part = contributor.part(job, epoch)
                fields.update(part.fields)
                events += part.events
            JobHistory.objects.update_or_create(job=job, defaults=fields)
            return events
    except Exception as exc:
        if strict:
            raise
        log.exception("the history record of job %s was not written", job.id)
        events = [builders.job_history_failed(job.id, epoch, str(exc))]
        for contributor in HISTORY_CONTRIBUTORS:
            events += contributor.failed(job, epoch, exc)
        return events


def record_pending_history(epoch: int) -> bool:
    """Active-master housekeeping: write the records that failed at the jobs' end. One job's
    failure is logged and retried on the next pass; only a stale epoch stops it."""
    pending = sorted({job_id for c in HISTORY_CONTRIBUTORS for job_id in c.pending()})
    written = False
    for job_id in pending:
        try:
            with fenced(epoch):
                job = Job.objects.select_for_update(no_key=True).filter(id=job_id).first()
                if job is None or job.status not in JOB_TERMINAL:
                    continue
                append_events(record_history(job, epoch, strict=True))
                written = True
        except StaleEpoch:
            raise
        except Exception:
            log.exception("the history record of job %s is still not written", job_id)
    return written
