"""Task-group reports and how they roll up into pipeline and job states.

Lock order, everywhere: the job row, then its pipelines and task groups, then slots. A task group
reports under its attempt and member: a report of an older attempt, or from a member that no
longer owns it, changes nothing (it returns False).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models.functions import Now

from engine import dirty
from engine.events import append_events
from engine.jobs import recovery
from engine.models import EngineEvent, Job, Pipeline, Slot, TaskGroup
from engine.states import (
    EXECUTION_TERMINAL,
    EXECUTION_TRANSITIONS,
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    ExecutionStatus,
    JobStatus,
    MemberState,
    SlotState,
    TaskGroupKind,
    check_transition,
)

ES = ExecutionStatus


def _lock_job_of(task_group_id: int) -> Job | None:
    job_id = TaskGroup.objects.filter(id=task_group_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return None
    return Job.objects.select_for_update(no_key=True).get(id=job_id)


def mark_running(task_group_id: int, attempt: int, member_id: int) -> bool:
    """DEPLOYING -> RUNNING for this attempt on this member; False if it is not ours any more."""
    with transaction.atomic():
        job = _lock_job_of(task_group_id)
        if (
            job is None
            or job.status in JOB_TERMINAL
            or job.status
            in (
                JobStatus.CANCELING,
                JobStatus.FAILING,
            )
        ):
            return False
        changed = TaskGroup.objects.filter(
            id=task_group_id,
            attempt=attempt,
            member_id=member_id,
            status=ES.DEPLOYING,
            member__state=MemberState.ALIVE,
        ).update(status=ES.RUNNING, updated_at=Now())
        if changed != 1:
            return False
        events = [
            EngineEvent(
                kind="taskgroup.status",
                job_id=job.id,
                payload={"taskGroupId": task_group_id, "attempt": attempt, "to": ES.RUNNING},
            )
        ]
        events += settle_job(job)
        append_events(events)
    return True


def owns(task_group_id: int, attempt: int, member_id: int) -> bool:
    """This attempt of the task group still belongs to this member and has not ended."""
    return (
        TaskGroup.objects.filter(id=task_group_id, attempt=attempt, member_id=member_id)
        .exclude(status__in=EXECUTION_TERMINAL)
        .exists()
    )


def readers_live(pipeline_id: int) -> bool:
    """Some reader of the pipeline has not ended (its enumerator keeps its slot until then)."""
    return (
        TaskGroup.objects.filter(pipeline_id=pipeline_id, kind=TaskGroupKind.READER)
        .exclude(status__in=EXECUTION_TERMINAL)
        .exists()
    )


def report_metrics(
    task_group_id: int,
    attempt: int,
    member_id: int,
    received: int,
    written: int,
    rows_per_second: float,
) -> bool:
    """Hot path: one conditional update, no event, no job lock."""
    return (
        TaskGroup.objects.filter(
            id=task_group_id, attempt=attempt, member_id=member_id, member__state=MemberState.ALIVE
        )
        .exclude(status__in=EXECUTION_TERMINAL)
        .update(
            source_received=received,
            sink_written=written,
            rows_per_second=rows_per_second,
            updated_at=Now(),
        )
        == 1
    )


def finish_task_group(
    task_group_id: int,
    attempt: int,
    member_id: int | None,
    status: str,
    error: str = "",
    metrics: tuple[int, int, float, float, float] | None = None,
    lost_member_id: int | None = None,
) -> bool:
    """A task group ends (FINISHED, FAILED or CANCELED): free its slot, roll up. Idempotent.

    ``lost_member_id``: it failed because that member was lost (its pipeline may restore).
    """
    with transaction.atomic():
        job = _lock_job_of(task_group_id)
        if job is None:
            return False
        query = TaskGroup.objects.select_for_update(no_key=True, of=("self",)).filter(
            id=task_group_id, attempt=attempt
        )
        if member_id is not None:  # a member reports: only while it owns the group and lives
            query = query.filter(member_id=member_id, member__state=MemberState.ALIVE)
        group = query.first()
        if group is None or group.status in EXECUTION_TERMINAL:
            return False
        check_transition(EXECUTION_TRANSITIONS, group.status, status)
        group.status = status
        group.error_msg = error[:4000]
        group.lost_member_id = lost_member_id
        fields = ["status", "error_msg", "updated_at", "lost_member"]
        group.updated_at = Now()
        if metrics is not None:
            (
                group.source_received,
                group.sink_written,
                group.rows_per_second,
                group.busy_seconds,
                group.cpu_seconds,
            ) = metrics
            fields += [
                "source_received",
                "sink_written",
                "rows_per_second",
                "busy_seconds",
                "cpu_seconds",
            ]
        group.save(update_fields=fields)
        if group.slot_id:
            Slot.objects.filter(id=group.slot_id).update(state=SlotState.FREE)
        events = [
            EngineEvent(
                kind="taskgroup.status",
                job_id=job.id,
                member_id=group.member_id,
                payload={
                    "taskGroupId": group.id,
                    "attempt": attempt,
                    "to": status,
                    **({"error": error[:500]} if error else {}),
                },
            )
        ]
        events += settle_job(job)
        append_events(events)
    return True


def fail_task_groups(groups: Iterable[TaskGroup], reason: str) -> int:
    """Fail task groups that can no longer report (their member is gone). Caller: master."""
    count = 0
    for group in sorted(groups, key=lambda g: (g.job_id, g.id)):
        if finish_task_group(group.id, group.attempt, None, ES.FAILED, reason):
            count += 1
    return count


def _path(table: dict, current: str, target: str) -> list[str]:
    """The shortest walk of valid transitions from ``current`` to ``target`` (excluding current).

    A roll-up can learn several things at once (a batch reader ran and finished before the
    pipeline was seen RUNNING); each edge is still taken, and recorded, one by one.
    """
    frontier, seen = [[current]], {current}
    while frontier:
        walk = frontier.pop(0)
        if walk[-1] == target:
            return walk[1:]
        for nxt in sorted(table.get(walk[-1], ())):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append([*walk, nxt])
    raise ValueError(f"no valid path {current} -> {target}")


def _pipeline_target(current: str, statuses: list[str]) -> str:
    """The pipeline status its task groups imply."""
    if current in EXECUTION_TERMINAL:
        return current
    terminal = all(s in EXECUTION_TERMINAL for s in statuses)
    if current == ES.CANCELING:
        return ES.CANCELED if terminal else ES.CANCELING
    if ES.FAILED in statuses or current == ES.FAILING:
        return ES.FAILED if terminal else ES.FAILING
    if terminal:
        return ES.FINISHED if all(s == ES.FINISHED for s in statuses) else ES.CANCELED
    if ES.CANCELED in statuses:
        return ES.CANCELING
    if all(s in (ES.RUNNING, ES.FINISHED) for s in statuses):
        return ES.RUNNING
    if current == ES.CREATED and ES.DEPLOYING in statuses:
        return ES.DEPLOYING
    return current


def _job_target(current: str, pipelines: list[Pipeline], restoring: set[int]) -> str:
    """The job status its pipelines imply; a pipeline that is restoring counts as running."""
    statuses = [ES.RUNNING if p.id in restoring else p.status for p in pipelines]
    terminal = all(s in EXECUTION_TERMINAL for s in statuses)
    failed = any(s in (ES.FAILED, ES.FAILING) for s in statuses)
    if current == JobStatus.CANCELING:
        return JobStatus.CANCELED if terminal else current
    if current == JobStatus.FAILING or (
        failed and current in (JobStatus.SCHEDULED, JobStatus.RUNNING)
    ):
        return JobStatus.FAILED if terminal else JobStatus.FAILING
    if current in (JobStatus.SCHEDULED, JobStatus.RUNNING):
        if terminal and all(s == ES.FINISHED for s in statuses):
            return JobStatus.FINISHED
        if terminal:  # some pipeline ended CANCELED without the job being cancelled
            return JobStatus.FAILED
        if all(s in (ES.RUNNING, ES.FINISHED) for s in statuses):
            return JobStatus.RUNNING
    return current


def _restorable(job: Job, pipeline: Pipeline, groups: list[dict]) -> bool:
    """Zeta's rule: a pipeline that failed only because members were lost restores, while its
    restore count is below ``job.retry.times`` and the job itself is not stopping."""
    failed = [g for g in groups if g["status"] == ES.FAILED]
    return (
        bool(failed)
        and all(g["lost_member_id"] for g in failed)
        and job.status in (JobStatus.SCHEDULED, JobStatus.RUNNING)
        and pipeline.restore_count < int(job.env.get("job.retry.times", 3))
    )


def settle_job(job: Job) -> list[EngineEvent]:
    """Roll task-group states up into pipelines and the job (job row locked by the caller).

    A pipeline that lost a member and may restore goes FAILING (its other task groups are
    cancelled); once all of them have ended, a durable restore step is created, due after
    ``job.retry.interval.seconds``. The job keeps running meanwhile.
    """
    if job.status in JOB_TERMINAL:
        return []
    pipelines = list(job.pipelines.order_by("index"))
    events = _settle(job, pipelines)
    if job.status in JOB_TERMINAL:  # it ended just now: history, then the running state goes
        events += dirty.on_job_terminal(job)
    else:
        events += dirty.after_settle(job, pipelines)
    return events


def _settle(job: Job, pipelines: list[Pipeline]) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    groups = list(
        TaskGroup.objects.filter(job=job).values(
            "pipeline_id", "status", "error_msg", "lost_member_id"
        )
    )
    restoring: set[int] = set()
    for pipeline in pipelines:
        mine = [g for g in groups if g["pipeline_id"] == pipeline.id]
        statuses = [g["status"] for g in mine]
        target = _pipeline_target(pipeline.status, statuses)
        if target in (ES.FAILING, ES.FAILED) and _restorable(job, pipeline, mine):
            restoring.add(pipeline.id)
            target = ES.FAILING
            if all(s in EXECUTION_TERMINAL for s in statuses):
                events += recovery.request_restore(job, pipeline, mine)
        if target == pipeline.status:
            continue
        errors = [g["error_msg"] for g in mine if g["status"] == ES.FAILED and g["error_msg"]]
        if errors and not pipeline.error_msg:
            pipeline.error_msg = errors[0]
        for step in _path(EXECUTION_TRANSITIONS, pipeline.status, target):
            events.append(
                EngineEvent(
                    kind="pipeline.status",
                    job_id=job.id,
                    payload={"pipelineId": pipeline.index, "from": pipeline.status, "to": step},
                )
            )
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
    for step in _path(JOB_TRANSITIONS, job.status, target):
        check_transition(JOB_TRANSITIONS, job.status, step)
        payload = {"from": job.status, "to": step}
        if step in (JobStatus.FAILING, JobStatus.FAILED):
            payload["errorMsg"] = job.error_msg
        events.append(EngineEvent(kind="job.status", job_id=job.id, payload=payload))
        job.status = step
    fields = ["status", "error_msg"]
    if job.status in JOB_TERMINAL:
        job.finished_at = Now()
        fields.append("finished_at")
    job.save(update_fields=fields)
    return events


def active_task_groups(job_ids: Iterable[int]) -> list[TaskGroup]:
    return list(
        TaskGroup.objects.filter(job_id__in=list(job_ids))
        .exclude(status__in=EXECUTION_TERMINAL)
        .select_related("member")
    )
