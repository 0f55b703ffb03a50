"""Submitting a job: validate and plan its config, then create it PENDING in one transaction.

Views and commands validate and call this; it appends its EngineEvent in the same transaction.
"""

from __future__ import annotations

import time
import uuid as uuidlib

from django.conf import settings
from django.db import connection, transaction

from engine import dirty
from engine import events as builders
from engine.cluster import slots
from engine.events import append_event
from engine.jobconfig import ConfigError, check_variables
from engine.jobs.envoptions import TAG_FILTER
from engine.jobs.planner import JobPlan, connects, plan_job
from engine.jobs.scheduler import placement_problem, unmatched
from engine.locks import DIRTY_VERSION_GATE
from engine.models import Job, Member, Pipeline, TaskGroup
from engine.protocol import CONTROL_QUEUE, DIRTY_TRACKING_SINCE, TASK_PLAN_JOB, WRITER_UUID_SINCE
from engine.redaction import redact_config
from engine.states import (
    JobStatus,
    MemberState,
    TaskGroupKind,
)


def submit_job(
    config_text: str,
    job_name: str | None = None,
    variables: dict[str, str] | None = None,
    submitted_by=None,
) -> Job:
    """Validate and plan ``config_text`` (ConfigError if invalid), then create the job PENDING.
    ``variables`` are what substitutions not defined in the config resolve from.

    Nothing is created for an invalid job: planning happens before the transaction.
    """
    plan = plan_config(config_text, job_name, variables)
    job = create_job(plan, config_text, submitted_by)
    job.warnings = plan.warnings  # for the answer only: what was accepted without effect
    return job


def plan_config(
    config_text: str, job_name: str | None = None, variables: dict[str, str] | None = None
) -> JobPlan:
    """Validate and plan a config (ConfigError if invalid); a job whose checks connect to
    databases is planned in a worker."""
    variables = check_variables(variables)
    if settings.ENGINE["connectors.check-in-workers"] and connects(config_text, variables):
        return plan_in_worker(config_text, job_name, variables)
    return plan_job(config_text, job_name, variables)


class WorkersUnavailable(Exception):
    """No worker answered in time to plan a job whose checks connect to databases."""


#: The plan is asked again this often within the check timeout (a fraction of it): a worker
#: that took the message and died (or was fenced) never answers, and the task is read-only.
PLAN_ASKS = 4


def plan_in_worker(config_text: str, job_name: str | None, variables: dict[str, str]) -> JobPlan:
    """Have a worker plan the job (its connection checks run there, never in the web
    process); WorkersUnavailable if none answers within ``engine.connectors.check-timeout``.
    Unanswered, it is asked again every quarter of that time; the first answer counts."""
    timeout = float(settings.ENGINE["connectors.check-timeout"])
    try:
        answer = _first_answer([config_text, job_name, variables], timeout)
    except Exception as exc:  # the broker or result store is unreachable
        raise WorkersUnavailable(f"cannot reach the workers to check the job: {exc}") from None
    if answer is None:
        raise WorkersUnavailable(
            f"no worker answered within {timeout:g} s to check the job's connections "
            "(its Jdbc checks run in a worker): are workers running?"
        )
    if "errors" in answer:
        raise ConfigError(answer["errors"])
    return JobPlan.from_json(answer["plan"])


def _first_answer(args: list, timeout: float) -> dict | None:
    """The first answer to the plan task, asked PLAN_ASKS times at most, each ask expiring at
    the deadline; None if none came by then. Every ask's result is forgotten."""
    from celery import current_app
    from celery.exceptions import TimeoutError as CeleryTimeout

    deadline = time.monotonic() + timeout
    asks = []
    try:
        for ask in range(PLAN_ASKS):
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            asks.append(
                current_app.send_task(TASK_PLAN_JOB, args=args, queue=CONTROL_QUEUE, expires=left)
            )
            until = min(deadline, time.monotonic() + timeout / PLAN_ASKS)
            if ask == PLAN_ASKS - 1:
                until = deadline
            while (wait := until - time.monotonic()) > 0:
                for earlier in asks[:-1]:
                    if earlier.ready():
                        return earlier.get(propagate=True, disable_sync_subtasks=False)
                try:
                    return asks[-1].get(
                        timeout=min(wait, 0.25), propagate=True, disable_sync_subtasks=False
                    )
                except CeleryTimeout:
                    continue
        return None
    finally:
        for result in asks:
            result.forget()


def create_job(plan: JobPlan, config_text: str, submitted_by=None) -> Job:
    tracked = (plan.env.get("job.dirty-task.threshold") or 0) > 0
    _check_pending_parts_reachable(plan)
    _check_fits(plan)
    with transaction.atomic():
        # Under the gate an older member's registration takes too: it either committed
        # before (and is seen here) or waits for this job (and is refused).
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", DIRTY_VERSION_GATE)
        if tracked:
            _check_dirty_tracking_supported()
        job = Job.objects.create(
            uuid=_writer_uuid(),
            name=plan.name,
            status=JobStatus.PENDING,
            mode=plan.mode,
            config_text=redact_config(config_text),
            env=plan.env,
            submitted_by=submitted_by if getattr(submitted_by, "pk", None) else None,
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
        for pipeline, planned in zip(pipelines, plan.pipelines, strict=True):
            groups.append(
                TaskGroup(job=job, pipeline=pipeline, kind=TaskGroupKind.ENUMERATOR, index=0)
            )
            groups += [
                TaskGroup(job=job, pipeline=pipeline, kind=TaskGroupKind.READER, index=i)
                for i in range(planned.parallelism)
            ]
        TaskGroup.objects.bulk_create(groups)
        append_event(builders.job_submitted(job, len(pipelines)))
    return job


def _check_fits(plan: JobPlan) -> None:
    """A job needing more slots than every ALIVE member could give is refused (with no member
    alive yet, a starting cluster, it is accepted and waits with its pendingReason). So is one
    whose ``tag_filter`` no ALIVE member matches: SeaTunnel fails such a job at once
    (NoEnoughResourceException), before it runs anywhere."""
    if slots.capacity() == 0:
        return
    tags = plan.env.get(TAG_FILTER)
    reason = unmatched(tags)
    if reason:
        raise ConfigError([{"path": f"env.{TAG_FILTER}", "message": reason}])
    reason = placement_problem(plan.slots_needed, tags)
    if not reason:
        return
    raise ConfigError(
        [
            {
                "path": "env.parallelism",
                "message": f"the job {reason} (pipelines x (parallelism + 1)): lower "
                "parallelism, or add workers first",
            }
        ]
    )


def _writer_uuid() -> uuidlib.UUID | None:
    """The job's uuid, which names its sink writers, when every alive member names writers so;
    none while an older member is alive (it would name them after the job id, and a restore
    between the two would not find what the other staged), and such a job keeps its id's
    names for good."""
    older = Member.objects.alive().filter(protocol_version__lt=WRITER_UUID_SINCE).exists()
    return None if older else uuidlib.uuid4()


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
