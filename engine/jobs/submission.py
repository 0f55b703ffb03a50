"""Submitting a job: validate and plan its config, then create it PENDING in one transaction.

Views and commands validate and call this; it appends its EngineEvent in the same transaction.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from engine import dirty
from engine import events as builders
from engine.events import append_event
from engine.jobconfig import ConfigError
from engine.jobs.planner import JobPlan, plan_job
from engine.models import Job, Member, Pipeline, TaskGroup
from engine.protocol import DIRTY_TRACKING_SINCE
from engine.states import (
    JobStatus,
    MemberState,
    TaskGroupKind,
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
    _check_pending_parts_reachable(plan)
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
        append_event(builders.job_submitted(job, len(pipelines)))
    return job


def _check_dirty_tracking_supported() -> None:
    """The rolling-upgrade rule: a job may enable dirty tracking only once no alive member or master
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


def _check_pending_parts_reachable(plan: JobPlan) -> None:
    """A checkpointed LocalFile sink keeps its pending parts under its path until a checkpoint
    commits them, and a restore may run its reader on another worker: on workers of several
    hosts, that path must be shared storage (``engine.localfile.shared-storage``)."""
    if not (plan.env.get("checkpoint.interval") or 0) > 0:
        return
    if settings.ENGINE["localfile.shared-storage"]:
        return
    sinks = [n for p in plan.pipelines for n in p.sinks if n.plugin == "LocalFile"]
    if not sinks:
        return
    hosts = sorted(
        set(Member.objects.filter(state=MemberState.ALIVE).values_list("host", flat=True))
    )
    if len(hosts) <= 1:
        return
    raise ConfigError(
        [
            {
                "path": f"{sink.path}.path",
                "message": f"a checkpointed LocalFile sink needs storage every worker reaches, "
                f"and the workers run on {len(hosts)} hosts ({', '.join(hosts[:5])}): its "
                "pending parts would be lost with a worker. Mount the path on every host and "
                "set engine.localfile.shared-storage (KEEL_LOCALFILE_SHARED_STORAGE=true), or "
                "use another sink",
            }
            for sink in sinks
        ]
    )
