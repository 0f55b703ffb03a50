"""Pipeline restore after member loss: the intent and its execution.

The restore intent is a ControlStep row that the roll-up (engine.jobs.rollup) creates once
every task group of the failed pipeline has ended, due after ``job.retry.interval.seconds``.
The active master runs due steps through the control queue (engine.master.control). Executing a
step is idempotent: it restores the pipeline only if it is still FAILING with that restore
number pending, else it is a no-op.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models.functions import Now
from django.utils import timezone

from engine import counters, dirty
from engine import events as builders
from engine.cluster import slots as slot_transitions
from engine.events import append_events
from engine.fencing import fenced
from engine.jobs import checkpoints, splits
from engine.jobs.scheduler import Deployment, deploy_on
from engine.models import (
    ControlStep,
    EngineEvent,
    Job,
    Pipeline,
    TaskGroup,
)
from engine.states import (
    EXECUTION_TERMINAL,
    ControlStepKind,
    ControlStepState,
    ExecutionStatus,
    JobStatus,
)

log = logging.getLogger("keel.recovery")
NO_SLOTS_RETRY = 1.0
#: What a restore that found too few slots returns (it stays due).
WAITING_FOR_SLOTS = "waiting for slots"


def request_restore(job: Job, pipeline: Pipeline, groups: list[dict]) -> list[EngineEvent]:
    """Create the pipeline's next restore step (idempotent by its key); the job row is locked
    by the caller's roll-up."""
    number = pipeline.restore_count + 1
    key = f"restore:{pipeline.id}:{number}"
    delay = float(job.env.get("job.retry.interval.seconds", 3) or 0)
    lost = sorted({g["lost_member_id"] for g in groups if g["lost_member_id"]})
    failed = [g for g in groups if g["status"] == ExecutionStatus.FAILED]
    planned = bool(failed) and all(g.get("planned_move") for g in failed)
    _, created = ControlStep.objects.get_or_create(
        key=key,
        defaults={
            "kind": ControlStepKind.RESTORE_PIPELINE,
            "job": job,
            "payload": {
                "pipelineId": pipeline.id,
                "restore": number,
                "lostMembers": lost,
                "planned": planned,
            },
            "due_at": timezone.now() + timedelta(seconds=delay),
        },
    )
    if not created:
        return []
    return [
        builders.pipeline_restore_requested(job.id, pipeline.index, number, delay),
        # Restore preparation: the dirty-job attempt is allocated (not counted) here.
        *dirty.on_restore_prepared(job, pipeline, number, lost),
    ]


def restore_pipeline(step: ControlStep, epoch: int) -> tuple[str, list[Deployment]]:
    """Restore: release (already freed), request slots, redeploy every task group of the
    pipeline as a new attempt, from the latest completed checkpoint (from the beginning when
    there is none).

    Taking the slots and redeploying onto them are one transaction: a restore that fails at
    any point (too few slots, an error after the take) gives back exactly the slots it took,
    and the job's other pipelines keep theirs."""
    pipeline_id = step.payload["pipelineId"]
    number = step.payload["restore"]
    with fenced(epoch):
        job = Job.objects.select_for_update(no_key=True).get(id=step.job_id)
        pipeline = Pipeline.objects.select_for_update(no_key=True).get(id=pipeline_id)
        step = ControlStep.objects.select_for_update(no_key=True).get(id=step.id)
        if step.state == ControlStepState.DONE:
            return "done already", []
        groups = list(
            TaskGroup.objects.select_for_update(no_key=True, of=("self",))
            .filter(pipeline=pipeline)
            .order_by("kind", "index")
        )
        obsolete = (
            job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING)
            or pipeline.status != ExecutionStatus.FAILING
            or pipeline.restore_count != number - 1
            or any(g.status not in EXECUTION_TERMINAL for g in groups)
        )
        if obsolete:
            _done(step, "obsolete: nothing to restore")
            append_events(dirty.on_restore_obsolete(job, pipeline, number, epoch))
            return "obsolete", []
        slots = slot_transitions.take(len(groups))
        if slots is None:
            # Not enough slots now: stay due, try again shortly (the rows locked roll back).
            ControlStep.objects.filter(id=step.id).update(
                due_at=Now() + timedelta(seconds=NO_SLOTS_RETRY),
                enqueued_at=None,
                attempts=step.attempts + 1,
            )
            return WAITING_FOR_SLOTS, []
        restored_from = _rewind_splits(pipeline, groups)
        deployments, group_events = deploy_on(groups, slots, epoch)
        previous = pipeline.error_msg
        planned = bool(step.payload.get("planned"))
        Pipeline.objects.filter(id=pipeline.id).update(
            status=ExecutionStatus.DEPLOYING,
            restore_count=number,
            planned_restores=pipeline.planned_restores + int(planned),
            error_msg="",
            splits_assigned=restored_from is not None,
        )
        _done(step, f"restored on {len(groups)} slots")
        counters.bump([(counters.RESTORES, "planned" if planned else "member_loss", 1)])
        append_events(
            [
                builders.pipeline_restore(
                    job.id,
                    epoch,
                    pipeline.index,
                    number,
                    cause=previous,
                    slots=[s for s, _ in slots],
                    from_checkpoint=restored_from,
                ),
                builders.pipeline_status(
                    job.id,
                    pipeline.index,
                    ExecutionStatus.FAILING,
                    ExecutionStatus.DEPLOYING,
                    epoch=epoch,
                ),
                *group_events,
                # The pipeline reached DEPLOYING on its new slots: the attempt counts now.
                *dirty.on_restore_deploying(job, pipeline, number, epoch),
            ]
        )
    log.warning("job %s pipeline %s restored (restore %s)", job.id, pipeline.index, number)
    return "restored", deployments


def _rewind_splits(pipeline: Pipeline, groups: list[TaskGroup]) -> int | None:
    """Put every reader back at the latest COMPLETED checkpoint (its split positions); without
    one, start over: the enumerator assigns the splits again. Returns the checkpoint id."""
    latest = checkpoints.latest_completed(pipeline.id)
    if latest is None:
        splits.forget(pipeline.id)
        return None
    for group in groups:
        splits.rewind(pipeline.id, checkpoints.reader_state(latest, group.id).get("splits") or {})
    return latest.id


def _done(step: ControlStep, result: str) -> None:
    ControlStep.objects.filter(id=step.id).update(
        state=ControlStepState.DONE, done_at=Now(), result=result, attempts=step.attempts + 1
    )
