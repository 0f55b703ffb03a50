"""Pipeline restore after member loss, run as durable control steps.

The restore intent is a ControlStep row created by the roll-up (engine.lifecycle) once every
task group of the failed pipeline has ended. The active master enqueues due steps on Celery's
``control`` queue (acks_late) under its epoch, and re-enqueues a step that is not DONE after
ENQUEUE_TIMEOUT or that was enqueued under an older epoch: a master or worker dying in the middle
of a recovery never leaves the pipeline stuck. Executing a step is idempotent: it restores the
pipeline only if it is still FAILING with that restore number pending, else it is a no-op.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from engine import dirty
from engine.events import append_events
from engine.fencing import StaleEpoch, fenced
from engine.jobs import checkpoints
from engine.jobs.scheduler import Deployment, deploy_on, take_slots
from engine.models import (
    ControlStep,
    EngineEvent,
    Job,
    Pipeline,
    SplitAssignment,
    TaskGroup,
)
from engine.states import EXECUTION_TERMINAL, ExecutionStatus, JobStatus

log = logging.getLogger("keel.recovery")
ENQUEUE_TIMEOUT = 10.0
NO_SLOTS_RETRY = 1.0


def enqueue_due_steps(epoch: int) -> bool:
    """Active-master step: put due control steps on the ``control`` queue (under our epoch)."""
    now = timezone.now()
    with fenced(epoch):
        due = list(
            ControlStep.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(state=ControlStep.State.PENDING, due_at__lte=now)
            .filter(
                Q(enqueued_at__isnull=True)
                | Q(enqueued_at__lt=now - timedelta(seconds=ENQUEUE_TIMEOUT))
                | ~Q(epoch=epoch)
            )
            .order_by("due_at", "id")[:100]
        )
        if due:
            ControlStep.objects.filter(id__in=[s.id for s in due]).update(
                enqueued_at=now, epoch=epoch
            )
    if not due:
        return False
    from engine.member.handlers import run_control_step

    for step in due:
        try:
            run_control_step.apply_async(args=[step.id, epoch], queue="control")
        except Exception:
            log.warning("could not enqueue control step %s", step.key, exc_info=True)
    return True


def run_step(step_id: int, epoch: int) -> str:
    """Execute one control step (in any worker's Celery pool). Returns what happened."""
    step = ControlStep.objects.filter(id=step_id).first()
    if step is None or step.state == ControlStep.State.DONE:
        return "done already"
    if step.kind != "restore-pipeline":
        return f"unknown step kind {step.kind}"
    try:
        result, deployments = restore_pipeline(step, epoch)
    except StaleEpoch:
        return "stale epoch: the active master re-enqueues it"
    if deployments:
        from engine.master.orchestration import send_deploy

        send_deploy(deployments)
    return result


def restore_pipeline(step: ControlStep, epoch: int) -> tuple[str, list[Deployment]]:
    """Restore: release (already freed), request slots, redeploy every task group of the
    pipeline as a new attempt, from the beginning (checkpoints come with their issue)."""
    pipeline_id = step.payload["pipelineId"]
    number = step.payload["restore"]
    with fenced(epoch):
        job = Job.objects.select_for_update(no_key=True).get(id=step.job_id)
        pipeline = Pipeline.objects.select_for_update(no_key=True).get(id=pipeline_id)
        step = ControlStep.objects.select_for_update(no_key=True).get(id=step.id)
        if step.state == ControlStep.State.DONE:
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
        slots = take_slots(len(groups))
        if slots is None:
            # Not enough slots now: stay due, try again shortly (the rows locked roll back).
            ControlStep.objects.filter(id=step.id).update(
                due_at=Now() + timedelta(seconds=NO_SLOTS_RETRY),
                enqueued_at=None,
                attempts=step.attempts + 1,
            )
            return "waiting for slots", []
        restored_from = _rewind_splits(pipeline, groups)
        deployments, group_events = deploy_on(groups, slots, epoch)
        previous = pipeline.error_msg
        Pipeline.objects.filter(id=pipeline.id).update(
            status=ExecutionStatus.DEPLOYING,
            restore_count=number,
            error_msg="",
            splits_assigned=restored_from is not None,
        )
        _done(step, f"restored on {len(groups)} slots")
        append_events(
            [
                EngineEvent(
                    kind="pipeline.restore",
                    job_id=job.id,
                    epoch=epoch,
                    payload={
                        "pipelineId": pipeline.index,
                        "restore": number,
                        "cause": previous,
                        "slots": [s for s, _ in slots],
                        "fromCheckpoint": restored_from,
                    },
                ),
                EngineEvent(
                    kind="pipeline.status",
                    job_id=job.id,
                    epoch=epoch,
                    payload={
                        "pipelineId": pipeline.index,
                        "from": ExecutionStatus.FAILING,
                        "to": ExecutionStatus.DEPLOYING,
                    },
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
        SplitAssignment.objects.filter(pipeline=pipeline).delete()
        return None
    for group in groups:
        state = checkpoints.reader_state(latest, group.id)
        for split_id, position in (state.get("splits") or {}).items():
            SplitAssignment.objects.filter(pipeline=pipeline, split_id=split_id).update(
                offset=position["offset"], done=position["done"]
            )
    return latest.id


def _done(step: ControlStep, result: str) -> None:
    ControlStep.objects.filter(id=step.id).update(
        state=ControlStep.State.DONE, done_at=Now(), result=result, attempts=step.attempts + 1
    )
