"""Job status transitions, and the one place a job ends.

``end_job`` is the terminal transition, whatever ends the job: its last task group finishing, a
failure, or a cancel before anything ran. It ends whatever of the job is still live (pipelines
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

from engine import dirty
from engine import events as builders
from engine.cluster import slots as slot_transitions
from engine.events import append_events
from engine.fencing import StaleEpoch, fenced
from engine.models import EngineEvent, Job, TaskGroup
from engine.states import (
    EXECUTION_TERMINAL,
    EXECUTION_TRANSITIONS,
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    ExecutionStatus,
    JobStatus,
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
    #: Ended jobs whose part is not recorded yet (a failed record is retried for them).
    pending: Callable[[], Iterable[int]]


HISTORY_CONTRIBUTORS = (HistoryContributor(dirty.history_part, dirty.pending_history),)


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
    events = _end_leftovers(job, _LEFTOVER_END[status], epoch)
    events += advance_job(job, status, epoch)
    job.finished_at = Now()
    job.save(update_fields=["status", "error_msg", "finished_at"])
    events += record_history(job, epoch)
    return events


def _end_leftovers(job: Job, status: str, epoch: int | None) -> list[EngineEvent]:
    """End the job's pipelines and task groups that have not ended (a job cancelled before it
    was scheduled has all of them), freeing any slot they hold."""
    events = []
    groups = list(
        TaskGroup.objects.select_for_update(no_key=True, of=("self",))
        .filter(job=job)
        .live()
        .order_by("pipeline_id", "kind", "index")
    )
    for group in groups:
        previous, group.status, group.updated_at = group.status, status, Now()
        group.save(update_fields=["status", "updated_at"])
        if group.slot_id:
            slot_transitions.free(group.slot_id)
        events.append(
            builders.taskgroup_status(
                job.id,
                group.id,
                group.attempt,
                previous,
                status,
                member_id=group.member_id,
                epoch=epoch,
            )
        )
    for pipeline in job.pipelines.exclude(status__in=EXECUTION_TERMINAL).order_by("index"):
        for step in transition_path(EXECUTION_TRANSITIONS, pipeline.status, status):
            events.append(
                builders.pipeline_status(job.id, pipeline.index, pipeline.status, step, epoch=epoch)
            )
            pipeline.status = step
        pipeline.save(update_fields=["status"])
    return events


def record_history(job: Job, epoch: int | None = None, *, strict: bool = False):
    """Write the finished-job record with every contributor's part, in a savepoint of the
    terminal transaction. A failure never blocks the job's end: it is logged and surfaced, the
    contributors keep their running state, and ``record_pending_history`` retries (``strict``:
    raise instead, for that retry's own containment)."""
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
        log.exception("the history record of job %s was not written; it is retried", job.id)
        return [builders.job_history_failed(job.id, epoch, str(exc))]


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
