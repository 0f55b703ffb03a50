"""Cancelling a job at a user's request (REST, dashboard): the change and its event, in one
transaction."""

from __future__ import annotations

from django.db import transaction
from django.db.models.functions import Now

from engine import dirty
from engine.events import append_events
from engine.jobs.lifecycle import settle_job
from engine.models import EngineEvent, Job
from engine.states import JOB_TERMINAL, JOB_TRANSITIONS, JobStatus, check_transition


class JobStateError(Exception):
    """The job is not in a state that allows the request (e.g. cancel of a finished job)."""


def cancel_job(job_id: int) -> Job:
    """Cancel a job. A job holding no slots is CANCELED at once; a scheduled or running job
    becomes CANCELING and the active master stops its task groups and frees its slots."""
    with transaction.atomic():
        job = Job.objects.select_for_update(no_key=True).get(id=job_id)
        if job.status in JOB_TERMINAL:
            raise JobStateError(f"job {job.id} is already {job.status}")
        if job.status in (JobStatus.CANCELING, JobStatus.FAILING):
            return job  # already stopping every task group; FAILING ends as FAILED
        target = (
            JobStatus.CANCELED
            if job.status in (JobStatus.CREATED, JobStatus.PENDING)
            else JobStatus.CANCELING
        )
        check_transition(JOB_TRANSITIONS, job.status, target)
        previous, job.status = job.status, target
        fields = ["status"]
        if target == JobStatus.CANCELED:
            job.finished_at = Now()
            fields.append("finished_at")
            job.pipelines.update(status="CANCELED")
            job.task_groups.update(status="CANCELED")
        job.save(update_fields=fields)
        events = [
            EngineEvent(kind="job.status", job_id=job.id, payload={"from": previous, "to": target})
        ]
        if target == JobStatus.CANCELED:
            events += dirty.on_job_terminal(job)
        if target == JobStatus.CANCELING:
            # Task groups that already ended (e.g. a pipeline waiting to restore) will not
            # report again: roll up now, so the job can end as soon as nothing runs.
            events += settle_job(job)
        append_events(events)
    job.refresh_from_db()
    return job
