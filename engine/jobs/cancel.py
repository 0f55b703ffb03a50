"""Cancelling a job at a user's request (REST, dashboard): the change and its events, in one
transaction."""

from __future__ import annotations

from django.db import transaction

from engine.events import append_events
from engine.jobs import rollup, terminal
from engine.models import Job
from engine.states import JOB_TERMINAL, JobStatus


class JobStateError(Exception):
    """The job is not in a state that allows the request (e.g. cancel of a finished job)."""


def cancel_job(job_id: int, by=None) -> Job:
    """Cancel a job (``by``: the user who asked, recorded on the job). A job holding no slots
    ends CANCELED at once; a scheduled or running job becomes CANCELING and the active master
    stops its task groups and frees their slots."""
    with transaction.atomic():
        job = Job.objects.select_for_update(no_key=True).get(id=job_id)
        if job.status in JOB_TERMINAL:
            raise JobStateError(f"job {job.id} is already {job.status}")
        if job.status in (JobStatus.CANCELING, JobStatus.FAILING):
            return job  # already stopping every task group; FAILING ends as FAILED
        if by is not None and getattr(by, "pk", None):
            Job.objects.filter(id=job.id).update(canceled_by=by)
            job.canceled_by = by
        if job.status in (JobStatus.CREATED, JobStatus.PENDING):
            events = terminal.end_job(job, JobStatus.CANCELED)
        else:
            events = terminal.advance_job(job, JobStatus.CANCELING)
            job.save(update_fields=["status"])
            # Task groups that already ended (a pipeline waiting to restore, say) will not
            # report again: roll up now, so the job can end as soon as nothing runs.
            events += rollup.settle_job(job)
        append_events(events)
    job.refresh_from_db()
    return job
