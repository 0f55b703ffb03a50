"""A rescale of a running Lane A job at a user's request (REST, CLI): the durable intent.

The request is a ControlStep of kind RESCALE_PIPELINE per pipeline, under the pipeline's next
restore key (``restore:<pipeline>:<number>``): a rescale is a restore of the pipeline, counted
and numbered as one, and while it is pending no other restore of the pipeline can be requested
(a member lost meanwhile finds the key taken, and the rescale restores the pipeline instead).
The active master runs it as it runs restores, under its epoch (engine.jobs.rescale_step): it
first stops the pipeline (FAILING, its attempts cancelled), then, once every task group ended,
restores it at the new parallelism. What can be known when it is asked is checked then (the
checkpoint can be dealt by split id, the cluster has room for the new readers): a refusal is an
answer, not a key held.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from engine import events as builders
from engine.cluster import slots as slot_transitions
from engine.events import append_events
from engine.jobs import checkpoints, rescale_step
from engine.jobs.envoptions import MAX_PARALLELISM, TAG_FILTER
from engine.jobs.scheduler import placement_problem
from engine.models import ControlStep, Job, Pipeline, Slot, TaskGroup
from engine.sourceruntime import Lane
from engine.sourceruntime.redistribution import NotRedistributable
from engine.states import (
    EXECUTION_LIVE,
    ControlStepKind,
    ControlStepState,
    ExecutionStatus,
    JobStatus,
    SlotState,
)


class RescaleRefused(Exception):
    """A rescale that cannot be taken; ``status`` is the HTTP status it answers (400 for a bad
    parallelism, naming the field; 409 for a job or pipeline that cannot rescale now)."""

    def __init__(self, message: str, status: int = 409, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.field = status, field


def restore_key(pipeline: Pipeline, number: int) -> str:
    """The key of the pipeline's restore ``number`` (engine.jobs.recovery's, shared)."""
    return f"restore:{pipeline.id}:{number}"


def check_parallelism(value: object, pipelines: int = 1) -> int:
    """The requested parallelism, or RescaleRefused (400, field ``parallelism``): an integer
    from 1 to the engine's maximum, within ``engine.config.max-readers`` for all
    ``pipelines``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise RescaleRefused("parallelism: an integer is required", 400, "parallelism")
    if not 1 <= value <= MAX_PARALLELISM:
        raise RescaleRefused(
            f"parallelism: must be from 1 to {MAX_PARALLELISM}", 400, "parallelism"
        )
    limit = settings.ENGINE["config.max-readers"]
    if value * pipelines > limit:
        raise RescaleRefused(
            f"parallelism: {pipelines} pipeline(s) with {value} readers each is over the limit "
            f"of {limit} readers (engine.config.max-readers)",
            400,
            "parallelism",
        )
    return value


def request_rescale(job_id: int, parallelism: object, by=None) -> Job:
    """Record the rescale of every pipeline of a RUNNING job to ``parallelism`` readers (one
    durable step each, due at once), or raise RescaleRefused: a job not RUNNING, a Lane B
    pipeline, one that is not RUNNING or is restoring already, one without a completed
    checkpoint, or one at that parallelism already."""
    with transaction.atomic():
        job = Job.objects.select_for_update(no_key=True).get(id=job_id)
        pipelines = list(Pipeline.objects.filter(job=job).order_by("index"))
        wanted = check_parallelism(parallelism, len(pipelines))
        if job.status != JobStatus.RUNNING:
            raise RescaleRefused(f"job {job.id} is {job.status}: only a RUNNING job rescales")
        if not (job.env.get("checkpoint.interval") or 0) > 0:
            raise RescaleRefused(
                f"job {job.id} has no checkpoints (env.checkpoint.interval): a rescale restores "
                "from a completed checkpoint"
            )
        for pipeline in pipelines:
            _check_pipeline(job, pipeline, wanted)
        _check_room(job, pipelines, wanted)
        who = by.get_username() if getattr(by, "pk", None) else ""
        events = []
        for pipeline in pipelines:
            number = pipeline.restore_count + 1
            payload = {
                "pipelineId": pipeline.id,
                "restore": number,
                "parallelism": wanted,
                "previous": pipeline.plan.get("parallelism", 1),
                "requestedBy": who,
            }
            _, created = ControlStep.objects.get_or_create(
                key=restore_key(pipeline, number),
                defaults={"kind": ControlStepKind.RESCALE_PIPELINE, "job": job, "payload": payload},
            )
            if not created:  # rolls back the steps of the pipelines before it
                raise RescaleRefused(f"pipeline {pipeline.index} of job {job.id} is restoring")
            event = builders.pipeline_restore_requested(job.id, pipeline.index, number, 0.0)
            event.payload["rescale"] = {"from": payload["previous"], "to": wanted, "by": who}
            events.append(event)
        append_events(events)
    return job


def _check_pipeline(job: Job, pipeline: Pipeline, wanted: int) -> None:
    where = f"pipeline {pipeline.index} of job {job.id}"
    if (pipeline.plan.get("sourceRuntime") or {}).get("lane") != Lane.MANAGED:
        raise RescaleRefused(f"{where} runs in Lane B: only a Lane A pipeline rescales")
    if pipeline.status != ExecutionStatus.RUNNING:
        raise RescaleRefused(f"{where} is {pipeline.status}: only a RUNNING pipeline rescales")
    if checkpoints.latest_completed(pipeline.id) is None:
        raise RescaleRefused(
            f"{where} has no completed checkpoint yet: a rescale restores from one"
        )
    if pipeline.plan.get("parallelism", 1) == wanted:
        raise RescaleRefused(f"{where} runs at parallelism {wanted} already")
    if ControlStep.objects.filter(
        key=restore_key(pipeline, pipeline.restore_count + 1), state=ControlStepState.PENDING
    ).exists():
        raise RescaleRefused(f"{where} is restoring")
    try:
        rescale_step.check(pipeline, wanted)
    except NotRedistributable as exc:
        raise RescaleRefused(
            f"{where}: its latest checkpoint cannot be dealt to {wanted} readers: {exc}"
        ) from None


def _check_room(job: Job, pipelines: list[Pipeline], wanted: int) -> None:
    """Refuse a rescale the cluster can never hold, or has no room for now (the workers the
    job's ``tag_filter`` allows: their free room and the slots the job holds there, which its
    stopped attempts give back): stopped for want of slots, it would only restore at its old
    parallelism."""
    tags = job.env.get(TAG_FILTER)
    needed = sum(1 + wanted for _ in pipelines)
    problem = placement_problem(needed, tags)
    if problem:
        raise RescaleRefused(f"job {job.id} at parallelism {wanted} {problem}")
    capacity = slot_transitions.capacity(tags)
    if capacity is None:
        return  # a dynamic member without a limit
    takers = slot_transitions.takers(tags)
    used = Slot.objects.filter(member__in=takers, state=SlotState.ASSIGNED).count()
    held = TaskGroup.objects.filter(
        job=job, status__in=EXECUTION_LIVE, slot__isnull=False, member__in=takers
    ).count()
    room = capacity - used + held
    if room < needed:
        raise RescaleRefused(
            f"job {job.id} at parallelism {wanted} needs {needed} slots and has room for "
            f"{room} now: free slots first"
        )


def stopped(job: Job, pipeline: Pipeline) -> bool:
    """The pipeline is FAILING because its rescale stopped it (its attempts end by cancel):
    the roll-up counts it as restoring, as it does a pipeline that lost a member, so neither
    it nor its job fails meanwhile."""
    if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
        return False
    if pipeline.status != ExecutionStatus.FAILING:
        return False
    # Either kind: a rescale that fell back to a restore at the old parallelism keeps its
    # ``stopped`` mark until that restore runs.
    return ControlStep.objects.filter(
        key=restore_key(pipeline, pipeline.restore_count + 1),
        kind__in=(ControlStepKind.RESCALE_PIPELINE, ControlStepKind.RESTORE_PIPELINE),
        state=ControlStepState.PENDING,
        payload__stopped=True,
    ).exists()
