"""Executing a rescale step (engine.jobs.rescale): a Lane A pipeline restored from its latest
completed checkpoint at the requested parallelism, run with the other restores under the
master's epoch (engine.jobs.recovery), in two phases as every restore is: no new attempt starts
while an old one may still run, write or commit.

Stop (the pipeline RUNNING): the checkpoint's redistribution is tried first, nothing written;
one that cannot be dealt by split id is refused here, before anything stopped (the step is
deleted, freeing the pipeline's restore key, and ``pipeline.rescale-refused`` says why). Else
the pipeline goes FAILING: its task groups keep their slots and are cancelled as a restoring
pipeline's are (engine.master.orchestration.CancelSender), the roll-up counts it as restoring
(``rescale.stopped``), and the step stays due.

Rescale (FAILING, every task group ended), in one transaction with the job, pipeline and task
group rows locked: the readers beyond the new parallelism are removed and the new ones created,
the checkpoint's snapshots are rewritten as if it had been taken at the new parallelism
(engine.sourceruntime.redistribution: the old readers' splits and offsets dealt by split id,
the enumerator's cut reconciled with what the old readers' metadata proves), and the enumerator
and every reader deploy as new attempts on free slots. Too few slots, or a checkpoint completed
meanwhile that cannot be dealt, and the step becomes the pipeline's restore at its old
parallelism (same key). A member lost meanwhile is restored by the rescale, and counted so.

Sink commits: a new reader restores its sinks from the checkpoint as a restore does (their
constructors commit it); the sinks of an old reader index that no longer runs are opened once,
under that index, by the new reader ``index mod N`` before it reads (``adoptedWriters`` in its
rewritten snapshot), which commits that index's share of the checkpoint exactly once and drops
what was staged after it. Every reader's attempt becomes one above the highest old reader
attempt, so a writer's fence (by attempt) ends any older session of an index it adopts.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import NamedTuple

from django.db import transaction
from django.db.models.functions import Now

from engine import counters, dirty
from engine import events as builders
from engine.cluster import slots as slot_transitions
from engine.jobs import checkpoints, exceptions
from engine.jobs.envoptions import TAG_FILTER
from engine.jobs.scheduler import Deployment, deploy_on
from engine.models import (
    Checkpoint,
    ControlStep,
    EngineEvent,
    Job,
    Pipeline,
    TaskCheckpoint,
    TaskGroup,
)
from engine.sourceruntime.redistribution import (
    NotRedistributable,
    adopted_writers,
    reconcile_enumerator,
    redistribute,
)
from engine.states import (
    EXECUTION_TERMINAL,
    ControlStepKind,
    ControlStepState,
    ExecutionStatus,
    JobStatus,
    TaskGroupKind,
)

log = logging.getLogger("keel.rescale")
#: What a step answers that waits for slots (engine.jobs.recovery.WAITING_FOR_SLOTS).
WAITING_FOR_SLOTS = "waiting for slots"
#: What it answers while the pipeline is deploying or its task groups still end.
WAITING_FOR_PIPELINE = "waiting for the pipeline"
#: What it answers once it stopped the pipeline's attempts (they end by cancel).
STOPPING = "stopping the pipeline"
#: How soon a waiting step is tried again.
RETRY = 1.0


class _NoSlots(Exception):
    """Too few free slots: everything the rescale did is rolled back."""


def execute(step: ControlStep, epoch: int) -> tuple[str, list[Deployment], list[EngineEvent]]:
    """Run a RESCALE_PIPELINE step (the caller's fenced transaction, its job locked first):
    what happened, the task groups to deploy once it committed, and its events."""
    job = Job.objects.select_for_update(no_key=True).get(id=step.job_id)
    pipeline = Pipeline.objects.select_for_update(no_key=True).get(id=step.payload["pipelineId"])
    step = ControlStep.objects.select_for_update(no_key=True).filter(id=step.id).first()
    if step is None or step.state == ControlStepState.DONE:
        return "done already", [], []
    number = step.payload["restore"]
    groups = list(
        TaskGroup.objects.select_for_update(no_key=True, of=("self",))
        .filter(pipeline=pipeline)
        .order_by("kind", "index")
    )
    why = _obsolete(job, pipeline, number)
    if why:
        _done(step, f"obsolete: {why}")
        return "obsolete", [], dirty.on_restore_obsolete(job, pipeline, number, epoch)
    if pipeline.status == ExecutionStatus.RUNNING:
        return _stop(job, pipeline, groups, step, epoch)
    if pipeline.status == ExecutionStatus.DEPLOYING or any(
        g.status not in EXECUTION_TERMINAL for g in groups
    ):
        _later(step)
        return WAITING_FOR_PIPELINE, [], []
    if step.payload.get("refused"):  # refused when it stopped: a member loss restores
        return _fall_back(job, pipeline, groups, step, step.payload["refused"], epoch)
    try:
        with transaction.atomic():
            deployments, events = _rescale(job, pipeline, groups, step, epoch)
    except _NoSlots:
        wanted = step.payload["parallelism"]
        why = f"too few free slots for the enumerator and {wanted} readers"
        return _fall_back(job, pipeline, groups, step, why, epoch)
    except NotRedistributable as exc:
        return _fall_back(job, pipeline, groups, step, str(exc), epoch)
    return "rescaled", deployments, events


def _obsolete(job: Job, pipeline: Pipeline, number: int) -> str:
    """Why the rescale has nothing to do, or ''."""
    if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
        return f"job is {job.status}"
    if pipeline.restore_count != number - 1:
        return "another restore came first"
    if pipeline.status not in (
        ExecutionStatus.RUNNING,
        ExecutionStatus.FAILING,
        ExecutionStatus.DEPLOYING,
    ):
        return f"pipeline is {pipeline.status}"
    return ""


def check(pipeline: Pipeline, wanted: int) -> None:
    """Raise NotRedistributable if the pipeline's latest completed checkpoint cannot be dealt
    to ``wanted`` readers (nothing is written: the request's and the stop's dry run)."""
    groups = list(TaskGroup.objects.filter(pipeline=pipeline))
    latest = checkpoints.latest_completed(pipeline.id)
    if latest is not None:
        _dealt(latest, groups, wanted)


def _stop(
    job: Job, pipeline: Pipeline, groups: list[TaskGroup], step: ControlStep, epoch: int
) -> tuple[str, list[Deployment], list[EngineEvent]]:
    """The first phase: a rescale that cannot be dealt is refused before anything stops (a
    pipeline with lost readers stops all the same and restores at its old parallelism); else
    the pipeline goes FAILING and its attempts are cancelled, keeping their slots until they
    end."""
    wanted = step.payload["parallelism"]
    try:
        check(pipeline, wanted)
        refused = ""
    except NotRedistributable as exc:
        refused = str(exc)
        if not any(g.status == ExecutionStatus.FAILED for g in groups):
            return _withdraw(job, pipeline, step, refused)
    Pipeline.objects.filter(id=pipeline.id).update(
        status=ExecutionStatus.FAILING,
        error_msg=f"stopped for a rescale to {wanted} readers",
    )
    payload = {**step.payload, "stopped": True, **({"refused": refused} if refused else {})}
    ControlStep.objects.filter(id=step.id).update(payload=payload)
    _later(step)
    log.warning(
        "job %s pipeline %s: stopping for a rescale to %s readers", job.id, pipeline.index, wanted
    )
    events = [
        builders.pipeline_status(
            job.id, pipeline.index, pipeline.status, ExecutionStatus.FAILING, epoch=epoch
        )
    ]
    if refused:
        events.append(refused_event(job.id, pipeline.index, step.payload, refused))
    return STOPPING, [], events


def _rescale(
    job: Job, pipeline: Pipeline, groups: list[TaskGroup], step: ControlStep, epoch: int
) -> tuple[list[Deployment], list[EngineEvent]]:
    """The second phase, every task group ended (their slots free already)."""
    payload = step.payload
    wanted, number = payload["parallelism"], payload["restore"]
    enumerator = next(g for g in groups if g.kind == TaskGroupKind.ENUMERATOR)
    readers = [g for g in groups if g.kind == TaskGroupKind.READER]
    top = max(g.attempt for g in readers)
    kept = [g for g in readers if g.index < wanted]
    gone = [g for g in readers if g.index >= wanted]
    losses = _losses(job, pipeline, groups, number, epoch)  # before the removed rows go
    made = TaskGroup.objects.bulk_create(
        TaskGroup(job=job, pipeline=pipeline, kind=TaskGroupKind.READER, index=i, attempt=top)
        for i in range(len(readers), wanted)
    )
    for group in kept:
        group.attempt = top  # deployed as top + 1, above every old reader's attempt
    latest = checkpoints.latest_completed(pipeline.id)
    if latest is not None:
        _rewrite(latest, enumerator, readers, [*kept, *made], wanted)
    _retire(gone)
    TaskGroup.objects.filter(id__in=[g.id for g in gone]).delete()
    targets = [enumerator, *kept, *made]
    slots = slot_transitions.take(len(targets), job.env.get(TAG_FILTER))
    if slots is None:
        raise _NoSlots
    deployments, group_events = deploy_on(targets, slots, epoch)
    previous = payload.get("previous", len(readers))
    Pipeline.objects.filter(id=pipeline.id).update(
        plan=_replanned(pipeline.plan, wanted),
        status=ExecutionStatus.DEPLOYING,
        error_msg="",
        restore_count=number,
        # A rescale uses no job.retry.times, unless it restored a member loss too.
        planned_restores=pipeline.planned_restores + int(losses.planned),
        splits_assigned=latest is not None,
    )
    Job.objects.filter(id=job.id).update(slots_needed=_slots_needed(job))
    who = payload.get("requestedBy")
    cause = f"rescale from parallelism {previous} to {wanted}" + (f" by {who}" if who else "")
    _done(step, f"rescaled from {len(readers)} to {wanted} readers on {len(targets)} slots")
    counters.bump([(counters.RESTORES, "planned" if losses.planned else "member_loss", 1)])
    log.warning("job %s pipeline %s: %s (restore %s)", job.id, pipeline.index, cause, number)
    restore = builders.pipeline_restore(
        job.id,
        epoch,
        pipeline.index,
        number,
        cause=cause,
        slots=[s for s, _ in slots],
        from_checkpoint=getattr(latest, "id", None),
    )
    restore.payload["rescale"] = {"from": len(readers), "to": wanted}
    moving = builders.pipeline_status(
        job.id, pipeline.index, pipeline.status, ExecutionStatus.DEPLOYING, epoch=epoch
    )
    deploying = dirty.on_restore_deploying(job, pipeline, number, epoch) if losses.lost else []
    return deployments, [*losses.events, restore, moving, *group_events, *deploying]


class _Losses(NamedTuple):
    """The member losses a rescale restores besides (none: a planned restore)."""

    lost: list[int]
    planned: bool
    events: list[EngineEvent]


def _losses(
    job: Job, pipeline: Pipeline, groups: list[TaskGroup], number: int, epoch: int
) -> _Losses:
    """A pipeline that lost members meanwhile restores by the rescale: the bookkeeping of
    engine.jobs.recovery's request (the failures that caused it, the dirty-job attempt)."""
    lost_groups = [g for g in groups if g.lost_member_id]
    if not lost_groups:
        return _Losses([], True, [])
    lost = sorted({g.lost_member_id for g in lost_groups})
    failed = [(g.id, g.attempt) for g in groups if g.status == ExecutionStatus.FAILED]
    exceptions.mark_restored(job.id, failed)
    planned = all(g.planned_move for g in lost_groups)
    return _Losses(lost, planned, dirty.on_restore_prepared(job, pipeline, number, lost, epoch))


def _replanned(plan: dict, wanted: int) -> dict:
    """The plan at ``wanted`` readers (the planner copies it into the source's config too)."""
    plan = {**plan, "parallelism": wanted}
    source = plan.get("source")
    if isinstance(source, dict) and isinstance(source.get("config"), dict):
        plan["source"] = {**source, "config": {**source["config"], "parallelism": wanted}}
    return plan


def _dealt(
    latest: Checkpoint, groups: list[TaskGroup], wanted: int
) -> tuple[dict | None, dict[int, dict]]:
    """The checkpoint's snapshots as if taken at ``wanted`` readers, computed and not written
    (NotRedistributable if they cannot be): the enumerator's with its reconciled cut (None:
    unchanged), and by new reader index each one's share of the old readers' splits (with
    their sinks' states where its index ran before, and the old indexes whose sinks it
    settles)."""
    old = [g for g in groups if g.kind == TaskGroupKind.READER]
    enumerator = next(g for g in groups if g.kind == TaskGroupKind.ENUMERATOR)
    states = checkpoints.acked_states(latest.id, [g.id for g in old])
    by_index = {g.index: states.get(g.id) or {} for g in old}
    managed = {index: state.get("managed") for index, state in by_index.items()}
    dealt = redistribute(managed, wanted)
    adopted = adopted_writers(
        {index: state.get("adoptedWriters") or [] for index, state in by_index.items()},
        len(old),
        wanted,
    )
    cut = None
    ack = TaskCheckpoint.objects.filter(checkpoint=latest, task_group=enumerator).first()
    if ack is not None and (ack.state or {}).get("managed"):
        proofs = {index: (m or {}).get("metadata") for index, m in managed.items()}
        cut = {**ack.state, "managed": reconcile_enumerator(ack.state["managed"], proofs)}
    readers = {
        index: {
            **by_index.get(index, {"sinks": []}),
            "managed": dealt[index],
            "adoptedWriters": adopted[index],
        }
        for index in range(wanted)
    }
    return cut, readers


def _rewrite(
    latest: Checkpoint,
    enumerator: TaskGroup,
    old: list[TaskGroup],
    new: list[TaskGroup],
    wanted: int,
) -> None:
    """Write the checkpoint's snapshots as if taken at ``wanted`` readers (``_dealt``)."""
    cut, readers = _dealt(latest, [enumerator, *old], wanted)
    if cut is not None:
        _store(latest, enumerator, cut)
    for group in new:
        _store(latest, group, readers[group.index])


def _store(checkpoint: Checkpoint, group: TaskGroup, state: dict) -> None:
    size = len(json.dumps(state).encode())
    if not TaskCheckpoint.objects.filter(checkpoint=checkpoint, task_group=group).update(
        state=state, size_bytes=size
    ):
        TaskCheckpoint.objects.create(
            checkpoint=checkpoint,
            task_group=group,
            attempt=group.attempt,
            state=state,
            size_bytes=size,
        )


def _retire(groups: list[TaskGroup]) -> None:
    """The counts of removed readers stay in the totals (as a replaced attempt's do)."""
    kinds = (
        (counters.ROWS_RETIRED, "read", "source_received"),
        (counters.ROWS_RETIRED, "written", "sink_written"),
        (counters.BYTES_RETIRED, "read", "source_received_bytes"),
        (counters.BYTES_RETIRED, "written", "sink_written_bytes"),
        (counters.JOB_ROWS_READ_RETIRED, None, "source_received"),
        (counters.JOB_ROWS_WRITTEN_RETIRED, None, "sink_written"),
    )
    counters.bump(
        [
            (name, label or str(g.job_id), getattr(g, field))
            for g in groups
            for name, label, field in kinds
        ]
    )


def _slots_needed(job: Job) -> int:
    plans = Pipeline.objects.filter(job=job).values_list("plan", flat=True)
    return sum(1 + (plan or {}).get("parallelism", 1) for plan in plans)


def refused_event(job_id: int, pipeline_index: int, payload: dict, why: str) -> EngineEvent:
    """``pipeline.rescale-refused``: a recorded rescale that will not run, and why."""
    return EngineEvent(
        kind="pipeline.rescale-refused",
        job_id=job_id,
        payload={
            "pipelineId": pipeline_index,
            "restore": payload["restore"],
            "parallelism": payload["parallelism"],
            "previous": payload.get("previous"),
            "reason": why,
        },
    )


def _withdraw(
    job: Job, pipeline: Pipeline, step: ControlStep, why: str
) -> tuple[str, list[Deployment], list[EngineEvent]]:
    """Refused before anything stopped: the step is deleted (as a withdrawn reader restore
    is), so the pipeline's next restore, a member loss's or another rescale, can take its
    key; the pipeline runs on as it is."""
    log.warning("job %s pipeline %s: rescale refused: %s", job.id, pipeline.index, why)
    ControlStep.objects.filter(id=step.id, state=ControlStepState.PENDING).delete()
    return "refused", [], [refused_event(job.id, pipeline.index, step.payload, why)]


def _fall_back(
    job: Job,
    pipeline: Pipeline,
    groups: list[TaskGroup],
    step: ControlStep,
    why: str,
    epoch: int,
) -> tuple[str, list[Deployment], list[EngineEvent]]:
    """A stopped pipeline that cannot rescale (too few slots, a checkpoint that cannot be
    dealt) restores at its old parallelism: the step becomes its restore under the same key,
    due now (engine.jobs.recovery runs it: FAILING, every task group ended). A member loss it
    restores besides is prepared as the roll-up's request would."""
    log.warning("job %s pipeline %s: rescale refused: %s", job.id, pipeline.index, why)
    number = step.payload["restore"]
    losses = _losses(job, pipeline, groups, number, epoch)
    ControlStep.objects.filter(id=step.id).update(
        kind=ControlStepKind.RESTORE_PIPELINE,
        payload={
            **step.payload,
            "lostMembers": losses.lost,
            "planned": losses.planned,
            "refused": why,
        },
        due_at=Now(),
        enqueued_at=None,
    )
    events = [*losses.events]
    if not step.payload.get("refused"):  # said when it stopped
        events.append(refused_event(job.id, pipeline.index, step.payload, why))
    return "refused: restores at its old parallelism", [], events


def _later(step: ControlStep) -> None:
    ControlStep.objects.filter(id=step.id).update(
        due_at=Now() + timedelta(seconds=RETRY), enqueued_at=None, attempts=step.attempts + 1
    )


def _done(step: ControlStep, result: str) -> None:
    ControlStep.objects.filter(id=step.id).update(
        state=ControlStepState.DONE, done_at=Now(), result=result, attempts=step.attempts + 1
    )
