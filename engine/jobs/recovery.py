"""Pipeline restore after member loss: the intent and its execution.

The restore intent is a ControlStep row that the roll-up (engine.jobs.rollup) creates once
every task group of the failed pipeline has ended, due after ``job.retry.interval.seconds``.
The active master runs due steps through the control queue (engine.master.control). Executing a
step is idempotent: it restores the pipeline only if it is still FAILING with that restore
number pending, else it is a no-op.

A reader restore (RESTORE_READERS) redeploys only some readers of a RUNNING Lane A pipeline,
lost with their member, while the enumerator and the other readers go on. It shares the
pipeline's restore numbering and key (``restore:<pipeline>:<number>``): it is a restore of the
pipeline, counted and tracked as one. Withdrawn before it ran (another task group failed), it
frees its key for the whole pipeline's restore.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from engine import counters, dirty
from engine import events as builders
from engine.cluster import slots as slot_transitions
from engine.dbsession import session_lost
from engine.events import append_events
from engine.fencing import StaleEpoch, fenced
from engine.jobs import checkpoints, exceptions, rescale_step, splits
from engine.jobs.envoptions import TAG_FILTER
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
#: What a step answers that is still waiting (no recovery moved).
WAITING = frozenset({WAITING_FOR_SLOTS, rescale_step.WAITING_FOR_PIPELINE})


def request_restore(
    job: Job, pipeline: Pipeline, groups: list[dict], *, readers: list[dict] | None = None
) -> list[EngineEvent]:
    """Create the pipeline's next restore step (idempotent by its key); the job row is locked
    by the caller's roll-up. ``readers``: restore only these failed readers (the rest of the
    pipeline runs on). The failures of its failed attempts are marked as having caused it
    (engine.jobs.exceptions)."""
    number = pipeline.restore_count + 1
    delay = float(job.env.get("job.retry.interval.seconds", 3) or 0)
    lost = sorted({g["lost_member_id"] for g in groups if g["lost_member_id"]})
    failed = [g for g in groups if g["status"] == ExecutionStatus.FAILED]
    planned = bool(failed) and all(g.get("planned_move") for g in failed)
    payload = {
        "pipelineId": pipeline.id,
        "restore": number,
        "lostMembers": lost,
        "planned": planned,
    }
    kind = ControlStepKind.RESTORE_PIPELINE
    if readers is not None:
        kind, payload["taskGroups"] = ControlStepKind.RESTORE_READERS, [g["id"] for g in readers]
    _, created = ControlStep.objects.get_or_create(
        key=_key(pipeline, number),
        defaults={
            "kind": kind,
            "job": job,
            "payload": payload,
            "due_at": timezone.now() + timedelta(seconds=delay),
        },
    )
    if not created:
        return []
    exceptions.mark_restored(job.id, [(g["id"], g["attempt"]) for g in failed])
    return [
        builders.pipeline_restore_requested(
            job.id, pipeline.index, number, delay, payload.get("taskGroups")
        ),
        # Restore preparation: the dirty-job attempt is allocated (not counted) here.
        *dirty.on_restore_prepared(job, pipeline, number, lost),
    ]


def _key(pipeline: Pipeline, number: int) -> str:
    return f"restore:{pipeline.id}:{number}"


def pending_reader_restore(pipeline: Pipeline) -> ControlStep | None:
    """The pipeline's next restore, if it is a reader restore not run yet."""
    return ControlStep.objects.filter(
        key=_key(pipeline, pipeline.restore_count + 1),
        kind=ControlStepKind.RESTORE_READERS,
        state=ControlStepState.PENDING,
    ).first()


def withdraw_reader_restore(
    job: Job, pipeline: Pipeline, step: ControlStep, *, restores: bool
) -> list[EngineEvent]:
    """A reader restore not run yet gives way (the caller's roll-up holds the job row, which
    its execution takes first, so it never runs after this): another task group failed, and
    the whole pipeline restores instead (``restores``: its step takes the same key and the
    same dirty-job attempt once every task group has ended), or ends."""
    number = step.payload["restore"]
    ControlStep.objects.filter(id=step.id, state=ControlStepState.PENDING).delete()
    reason = "the whole pipeline restores" if restores else "the pipeline fails"
    events = [
        builders.pipeline_restore_withdrawn(
            job.id, pipeline.index, number, step.payload["taskGroups"], reason
        )
    ]
    if not restores:  # its prepared attempt will never deploy
        events += dirty.on_restore_obsolete(job, pipeline, number, None)
    return events


def restore_pipeline(step: ControlStep, epoch: int) -> tuple[str, list[Deployment]]:
    """Restore one pipeline (restore_pipelines with one step): what happened, and the task
    groups to deploy once it committed."""
    results, deployments = restore_pipelines([step], epoch)  # a lone step's error is raised
    return results[step.id], deployments


def restore_pipelines(
    steps: list[ControlStep], epoch: int, *, skip_locked: bool = False
) -> tuple[dict[int, str | Exception], list[Deployment]]:
    """Run restore steps in one fenced transaction: their jobs locked first, in id order (the
    lock order; nothing a step takes later, a metric total or a member row, is held before a
    job lock), then each step in a savepoint of its own, and their events appended once,
    last: a storm's restores cost a few commits and turns of the event-append lock, not one
    each. ``skip_locked``: a step whose job another transaction holds is left out (no answer;
    the caller has it run elsewhere) rather than waited for. A step that raises is rolled back
    alone (its answer is the error; the caller has it run again); an error of the whole
    transaction (a stale epoch, a lost session, the append lock not taken in time) is raised
    and nothing of it holds. Answers by step id, and the task groups to deploy once it
    committed."""
    results: dict[int, str | Exception] = {}
    deployments: list[Deployment] = []
    with fenced(epoch):
        locked = set(
            Job.objects.select_for_update(no_key=True, skip_locked=skip_locked)
            .filter(id__in={s.job_id for s in steps})
            .order_by("id")
            .values_list("id", flat=True)
        )
        events: list[EngineEvent] = []
        for step in sorted(steps, key=lambda s: (s.job_id, s.id)):
            if step.job_id not in locked and skip_locked:
                continue
            try:
                with transaction.atomic():
                    result, deployed, made = _restore(step, epoch)
            except StaleEpoch:
                raise
            except Exception as exc:  # this step only: its savepoint rolled back
                if len(steps) == 1 or session_lost(exc):
                    raise
                log.exception("restore step %s failed", step.id)
                results[step.id] = exc
                continue
            results[step.id] = result
            deployments += deployed
            events += made
        append_events(events)
    for step in steps:
        if results.get(step.id) == "restored":
            log.warning(
                "job %s pipeline restored (restore %s)", step.job_id, step.payload["restore"]
            )
    return results, deployments


def _restore(step: ControlStep, epoch: int) -> tuple[str, list[Deployment], list[EngineEvent]]:
    """Release (already freed), request slots, redeploy every task group of the pipeline (of a
    reader restore: its readers) as a new attempt, from the latest completed checkpoint (from
    the beginning when there is none), in the caller's transaction. Taking the slots and
    redeploying onto them go together: a restore that fails at any point (too few slots, an
    error after the take) gives back exactly the slots it took, and the job's other pipelines
    (a reader restore's enumerator and other readers) keep theirs."""
    if step.kind == ControlStepKind.RESCALE_PIPELINE:  # a restore at another parallelism
        return rescale_step.execute(step, epoch)
    pipeline_id = step.payload["pipelineId"]
    number = step.payload["restore"]
    job = Job.objects.select_for_update(no_key=True).get(id=step.job_id)
    pipeline = Pipeline.objects.select_for_update(no_key=True).get(id=pipeline_id)
    step = ControlStep.objects.select_for_update(no_key=True).filter(id=step.id).first()
    if step is None or step.state == ControlStepState.DONE:
        return "done already", [], []  # or withdrawn: the whole pipeline's restore replaced it
    groups = list(
        TaskGroup.objects.select_for_update(no_key=True, of=("self",))
        .filter(pipeline=pipeline)
        .order_by("kind", "index")
    )
    readers = step.payload.get("taskGroups")
    targets = groups if readers is None else [g for g in groups if g.id in readers]
    if _obsolete(job, pipeline, number, groups, readers):
        _done(step, "obsolete: nothing to restore")
        return "obsolete", [], dirty.on_restore_obsolete(job, pipeline, number, epoch)
    # A restore stays on the workers the job's tag_filter allows (else it waits, as for slots).
    slots = slot_transitions.take(len(targets), job.env.get(TAG_FILTER))
    if slots is None:
        # Not enough slots now: stay due, try again shortly.
        ControlStep.objects.filter(id=step.id).update(
            due_at=Now() + timedelta(seconds=NO_SLOTS_RETRY),
            enqueued_at=None,
            attempts=step.attempts + 1,
        )
        return WAITING_FOR_SLOTS, [], []
    if readers is None:
        restored_from = _rewind_splits(pipeline, groups)
    else:  # Lane A: each reader restores its own snapshot; the enumerator owns the splits
        restored_from = getattr(checkpoints.latest_completed(pipeline.id), "id", None)
    deployments, group_events = deploy_on(targets, slots, epoch)
    previous = pipeline.error_msg if readers is None else _causes(targets)
    planned = bool(step.payload.get("planned"))
    counts = {"restore_count": number, "planned_restores": pipeline.planned_restores + int(planned)}
    if readers is None:
        counts.update(
            status=ExecutionStatus.DEPLOYING,
            error_msg="",
            splits_assigned=restored_from is not None,
        )
    Pipeline.objects.filter(id=pipeline.id).update(**counts)
    whom = "" if readers is None else f" for {len(targets)} reader(s)"
    _done(step, f"restored on {len(targets)} slots{whom}")
    counters.bump([(counters.RESTORES, "planned" if planned else "member_loss", 1)])
    events = [
        builders.pipeline_restore(
            job.id,
            epoch,
            pipeline.index,
            number,
            cause=previous,
            slots=[s for s, _ in slots],
            from_checkpoint=restored_from,
            task_groups=readers,
        ),
        *_deploying(job, pipeline, epoch, readers),
        *group_events,
        # The pipeline (or its readers) reached DEPLOYING on new slots: the attempt counts now.
        *(dirty.on_restore_deploying(job, pipeline, number, epoch) if _prepared(step) else []),
    ]
    return "restored", deployments, events


def _prepared(step: ControlStep) -> bool:
    """The restore has a dirty-job attempt: every member loss's has; a refused rescale's
    (engine.jobs.rescale_step) only if it restores a member loss too."""
    return "refused" not in step.payload or bool(step.payload.get("lostMembers"))


def _obsolete(
    job: Job, pipeline: Pipeline, number: int, groups: list[TaskGroup], readers: list[int] | None
) -> bool:
    """The restore has nothing to do: the job is stopping, or the pipeline moved on (another
    restore came first; a reader restore's pipeline is no longer RUNNING, or its readers no
    longer wait, failed with their member)."""
    if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
        return True
    if pipeline.restore_count != number - 1:
        return True
    if readers is None:
        return pipeline.status != ExecutionStatus.FAILING or any(
            g.status not in EXECUTION_TERMINAL for g in groups
        )
    waiting = [
        g
        for g in groups
        if g.id in readers and g.status == ExecutionStatus.FAILED and g.lost_member_id
    ]
    return pipeline.status != ExecutionStatus.RUNNING or len(waiting) != len(readers)


def _causes(groups: list[TaskGroup]) -> str:
    return "; ".join(dict.fromkeys(g.error_msg for g in groups if g.error_msg))


def _deploying(
    job: Job, pipeline: Pipeline, epoch: int, readers: list[int] | None
) -> list[EngineEvent]:
    """The pipeline's own move to DEPLOYING (a reader restore's pipeline stays RUNNING)."""
    if readers is not None:
        return []
    return [
        builders.pipeline_status(
            job.id,
            pipeline.index,
            ExecutionStatus.FAILING,
            ExecutionStatus.DEPLOYING,
            epoch=epoch,
        )
    ]


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
