"""Every state change of a job's lifecycle that is not the master's: submission and cancel.

Views validate and call these; each change appends its EngineEvent in the same transaction.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models.functions import Now

from . import dirty
from .events import append_event, append_events
from .jobconfig import ConfigError
from .lifecycle import settle_job
from .models import EngineEvent, Job, Pipeline, TaskGroup
from .planner import JobPlan, plan_job
from .protocol import DIRTY_TRACKING_SINCE
from .states import (
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    JobStatus,
    TaskGroupKind,
    check_transition,
)


def submit_job(config_text: str, job_name: str | None = None) -> Job:
    """Validate and plan ``config_text`` (ConfigError if invalid), then create the job PENDING.

    Nothing is created for an invalid job: planning happens before the transaction.
    """
    plan = plan_job(config_text, job_name)
    return create_job(plan, config_text)


def create_job(plan: JobPlan, config_text: str) -> Job:
    if (plan.env.get("job.dirty-task.threshold") or 0) > 0:
        _check_dirty_tracking_supported()
    with transaction.atomic():
        job = Job.objects.create(
            name=plan.name,
            status=JobStatus.PENDING,
            mode=plan.mode,
            config_text=config_text,
            env=plan.env,
            slots_needed=plan.slots_needed,
            dirty_threshold=plan.env.get("job.dirty-task.threshold") or -1,
        )
        # Before the job can be scheduled (it is, once this commits): engine.dirty.
        dirty.init_state(job)
        pipelines = Pipeline.objects.bulk_create(
            Pipeline(job=job, index=i, plan=p.to_json())
            for i, p in enumerate(plan.pipelines, start=1)
        )
        groups = []
        for pipeline in pipelines:
            groups.append(
                TaskGroup(job=job, pipeline=pipeline, kind=TaskGroupKind.ENUMERATOR, index=0)
            )
            groups += [
                TaskGroup(job=job, pipeline=pipeline, kind=TaskGroupKind.READER, index=i)
                for i in range(plan.parallelism)
            ]
        TaskGroup.objects.bulk_create(groups)
        append_event(
            "job.submitted",
            job_id=job.id,
            payload={
                "jobName": job.name,
                "jobStatus": job.status,
                "mode": job.mode,
                "pipelines": len(pipelines),
                "slotsNeeded": job.slots_needed,
            },
        )
    return job


def _check_dirty_tracking_supported() -> None:
    """Seed 000 rollout rule: a job may enable dirty tracking only once no alive member or master
    runs an older protocol (an old member could not take part in the tracking)."""
    older = dirty.older_members()
    if older:
        raise ConfigError(
            [
                {
                    "path": "env.job.dirty-task.threshold",
                    "message": "dirty-job tracking cannot be enabled while the cluster runs "
                    f"mixed versions: {'; '.join(older)} (it needs protocol "
                    f"{DIRTY_TRACKING_SINCE}); upgrade every member first",
                }
            ]
        )


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
