"""The roll-up: task-group states imply pipeline states, pipeline states the job's.

It runs in the transaction of every task-group report (the job row locked). A pipeline that lost
a member and may restore goes FAILING and, once all its task groups have ended, gets its durable
restore step (engine.jobs.recovery); the job keeps running meanwhile. A Lane A pipeline that lost
only readers is their failover region: it keeps running, and a restore step for just those
readers is created at once (docs/decisions/0039-reader-failover.md). A job whose pipelines have
all ended ends through engine.jobs.terminal.
"""

from __future__ import annotations

from engine import dirty
from engine import events as builders
from engine.jobs import recovery, rescale, terminal
from engine.models import EngineEvent, Job, Pipeline, TaskGroup
from engine.states import (
    EXECUTION_TERMINAL,
    EXECUTION_TRANSITIONS,
    JOB_TERMINAL,
    ExecutionStatus,
    JobStatus,
    TaskGroupKind,
    transition_path,
)

#: What the rest of a pipeline may be doing while some of its readers restore alone.
_BESIDE_A_READER_RESTORE = (
    ExecutionStatus.DEPLOYING,
    ExecutionStatus.RUNNING,
    ExecutionStatus.FINISHED,
)


def _pipeline_target(current: str, statuses: list[str]) -> str:
    """The pipeline status its task groups imply."""
    if current in EXECUTION_TERMINAL:
        return current
    ended = all(s in EXECUTION_TERMINAL for s in statuses)
    if current == ExecutionStatus.CANCELING:
        return ExecutionStatus.CANCELED if ended else ExecutionStatus.CANCELING
    if ExecutionStatus.FAILED in statuses or current == ExecutionStatus.FAILING:
        return ExecutionStatus.FAILED if ended else ExecutionStatus.FAILING
    if ended:
        return (
            ExecutionStatus.FINISHED
            if all(s == ExecutionStatus.FINISHED for s in statuses)
            else ExecutionStatus.CANCELED
        )
    if ExecutionStatus.CANCELED in statuses:
        return ExecutionStatus.CANCELING
    if all(s in (ExecutionStatus.RUNNING, ExecutionStatus.FINISHED) for s in statuses):
        return ExecutionStatus.RUNNING
    if current == ExecutionStatus.CREATED and ExecutionStatus.DEPLOYING in statuses:
        return ExecutionStatus.DEPLOYING
    return current


def _job_target(current: str, pipelines: list[Pipeline], restoring: set[int]) -> str:
    """The job status its pipelines imply; a pipeline that is restoring counts as running."""
    statuses = [ExecutionStatus.RUNNING if p.id in restoring else p.status for p in pipelines]
    ended = all(s in EXECUTION_TERMINAL for s in statuses)
    failed = any(s in (ExecutionStatus.FAILED, ExecutionStatus.FAILING) for s in statuses)
    if current == JobStatus.CANCELING:
        return JobStatus.CANCELED if ended else current
    if current == JobStatus.FAILING or (
        failed and current in (JobStatus.SCHEDULED, JobStatus.RUNNING)
    ):
        return JobStatus.FAILED if ended else JobStatus.FAILING
    if current in (JobStatus.SCHEDULED, JobStatus.RUNNING):
        if ended and all(s == ExecutionStatus.FINISHED for s in statuses):
            return JobStatus.FINISHED
        if ended:  # some pipeline ended CANCELED without the job being cancelled
            return JobStatus.FAILED
        if all(s in (ExecutionStatus.RUNNING, ExecutionStatus.FINISHED) for s in statuses):
            return JobStatus.RUNNING
    return current


def _restorable(job: Job, pipeline: Pipeline, groups: list[dict]) -> bool:
    """Zeta's rule: a pipeline that failed only because members were lost restores, while its
    restore count is below ``job.retry.times`` and the job itself is not stopping. Restores
    that moved it off a drained member do not count, and a planned move always restores."""
    failed = [g for g in groups if g["status"] == ExecutionStatus.FAILED]
    if not failed or not all(g["lost_member_id"] for g in failed):
        return False
    if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
        return False
    if all(g["planned_move"] for g in failed):
        return True
    used = pipeline.restore_count - pipeline.planned_restores
    return used < int(job.env.get("job.retry.times", 3))


def _lost_readers(job: Job, pipeline: Pipeline, groups: list[dict]) -> list[dict] | None:
    """The failed readers of a RUNNING Lane A pipeline that restore alone, or None: each reader
    runs its own chain (no exchange between readers), so it is a failover region of its own,
    while the enumerator runs (it learns the reader's new attempt) and the rest is running,
    deploying or finished. ``_restorable``'s rule applies as to a whole pipeline (member losses
    only, ``job.retry.times``, planned moves). Without checkpoints nothing proves what a reader
    had (its enumerator forgets what was admitted): only the whole pipeline reads it again."""
    if not (job.env.get("checkpoint.interval") or 0) > 0:
        return None
    failed = [g for g in groups if g["status"] == ExecutionStatus.FAILED]
    if not failed or any(g["kind"] != TaskGroupKind.READER for g in failed):
        return None
    rest = [g for g in groups if g["status"] != ExecutionStatus.FAILED]
    if any(g["status"] not in _BESIDE_A_READER_RESTORE for g in rest):
        return None
    if not any(
        g["kind"] == TaskGroupKind.ENUMERATOR and g["status"] == ExecutionStatus.RUNNING
        for g in rest
    ):
        return None
    return failed if _restorable(job, pipeline, groups) else None


def _is_lane_a(pipeline: Pipeline) -> bool:
    return (pipeline.plan.get("sourceRuntime") or {}).get("lane") == "A"


def _reader_failover(
    job: Job, pipeline: Pipeline, groups: list[dict]
) -> tuple[bool, list[EngineEvent]]:
    """For a pipeline with a failed task group: (True, events) when its failed readers restore
    alone (the pipeline stays RUNNING), (False, events) for the whole-pipeline path. A reader
    restore still pending for other readers than those failed now (a second reader or the
    enumerator was lost meanwhile) is withdrawn, and the whole pipeline restores instead: the
    safe fallback (its events are the withdrawal's)."""
    if pipeline.status != ExecutionStatus.RUNNING or not _is_lane_a(pipeline):
        return False, []
    pending = recovery.pending_reader_restore(pipeline)
    readers = _lost_readers(job, pipeline, groups)
    if readers is not None:
        if pending is None:
            return True, recovery.request_restore(job, pipeline, groups, readers=readers)
        if set(pending.payload["taskGroups"]) == {g["id"] for g in readers}:
            return True, []  # requested by an earlier roll-up
    if pending is None:
        return False, []
    restores = _restorable(job, pipeline, groups)
    return False, recovery.withdraw_reader_restore(job, pipeline, pending, restores=restores)


def settle_job(job: Job) -> list[EngineEvent]:
    """Roll task-group states up into pipelines and the job (job row locked by the caller).

    A pipeline that lost a member and may restore goes FAILING (its other task groups are
    cancelled); once all of them have ended, a durable restore step is created, due after
    ``job.retry.interval.seconds``. The job keeps running meanwhile. A running Lane A pipeline
    that lost only readers keeps running: the step restores just them (``_lost_readers``).
    """
    if job.status in JOB_TERMINAL:
        return []
    pipelines = list(job.pipelines.order_by("index"))
    events = _settle(job, pipelines)
    if job.status not in JOB_TERMINAL:
        events += dirty.after_settle(job, pipelines)
    return events


def _settle(job: Job, pipelines: list[Pipeline]) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    groups = list(
        TaskGroup.objects.filter(job=job).values(
            "id",
            "kind",
            "attempt",
            "pipeline_id",
            "status",
            "error_msg",
            "lost_member_id",
            "planned_move",
        )
    )
    restoring: set[int] = set()
    for pipeline in pipelines:
        mine = [g for g in groups if g["pipeline_id"] == pipeline.id]
        statuses = [g["status"] for g in mine]
        if ExecutionStatus.FAILED in statuses:
            alone, made = _reader_failover(job, pipeline, mine)
            events += made
            if alone:
                continue
        target = _pipeline_target(pipeline.status, statuses)
        if target in (ExecutionStatus.FAILING, ExecutionStatus.FAILED) and (
            _restorable(job, pipeline, mine) or rescale.stopped(job, pipeline)
        ):
            restoring.add(pipeline.id)
            target = ExecutionStatus.FAILING
            if all(s in EXECUTION_TERMINAL for s in statuses):
                events += recovery.request_restore(job, pipeline, mine)
        if target == pipeline.status:
            continue
        errors = [
            g["error_msg"] for g in mine if g["status"] == ExecutionStatus.FAILED and g["error_msg"]
        ]
        if errors and not pipeline.error_msg:
            pipeline.error_msg = errors[0]
        for step in transition_path(EXECUTION_TRANSITIONS, pipeline.status, target):
            events.append(builders.pipeline_status(job.id, pipeline.index, pipeline.status, step))
            pipeline.status = step
        pipeline.save(update_fields=["status", "error_msg"])
    target = _job_target(job.status, pipelines, restoring)
    if target == job.status:
        return events
    failed = [p for p in pipelines if p.error_msg and p.id not in restoring]
    if target in (JobStatus.FAILING, JobStatus.FAILED) and not job.error_msg and failed:
        job.error_msg = f"pipeline {failed[0].index}: {failed[0].error_msg}"
        if failed[0].restore_count:
            job.error_msg += (
                f" (after {failed[0].restore_count} restore(s); job.retry.times = "
                f"{job.env.get('job.retry.times', 3)})"
            )
    if target in JOB_TERMINAL:
        return events + terminal.end_job(job, target)
    events += terminal.advance_job(job, target)
    job.save(update_fields=["status", "error_msg"])
    return events
