"""Task-group reports: RUNNING, metrics, and how a task group ended; each rolls up into its
pipeline and job (engine.jobs.rollup) in the same transaction.

Lock order, everywhere: the job row, then its pipelines and task groups, then slots. A task group
reports under its attempt and member: a report of an older attempt, or from a member that no
longer owns it, changes nothing (it returns False).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now

from engine import events as builders
from engine.cluster import slots as slot_transitions
from engine.events import append_events
from engine.jobs import exceptions, rollup
from engine.models import Job, TaskGroup
from engine.states import (
    EXECUTION_LIVE,
    EXECUTION_TERMINAL,
    EXECUTION_TRANSITIONS,
    JOB_TERMINAL,
    ExecutionStatus,
    JobStatus,
    MemberState,
    TaskGroupKind,
    check_transition,
)


def _lock_job_of(task_group_id: int) -> Job | None:
    job_id = TaskGroup.objects.filter(id=task_group_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return None
    return Job.objects.select_for_update(no_key=True).get(id=job_id)


def _lock_jobs_of(task_group_ids: Iterable[int]) -> tuple[dict[int, int], list[Job]]:
    """The job of each task group, and those jobs locked in id order (the lock order), for a
    transaction that reports on several task groups at once."""
    job_of = dict(TaskGroup.objects.filter(id__in=set(task_group_ids)).values_list("id", "job_id"))
    jobs = Job.objects.select_for_update(no_key=True).filter(id__in=set(job_of.values()))
    return job_of, list(jobs.order_by("id"))


def mark_running(task_group_id: int, attempt: int, member_id: int) -> bool:
    """DEPLOYING -> RUNNING for this attempt on this member; False if it is not ours any more.

    Idempotent: reporting again what already holds (a retry after a commit whose answer was
    lost to a database blip) answers True, so the task group runs rather than stopping."""
    return mark_running_many(member_id, [(task_group_id, attempt)])[(task_group_id, attempt)]


def mark_running_many(
    member_id: int, reports: list[tuple[int, int]]
) -> dict[tuple[int, int], bool]:
    """mark_running for several (task group id, attempt) of one member in one transaction:
    the jobs locked in id order (the lock order), each rolled up once, the events appended
    last. A worker starting a storm's restores reports them together (engine.member.reports),
    not a transaction and a turn of the event-append lock each."""
    answers = dict.fromkeys(reports, False)
    with transaction.atomic():
        job_of, jobs = _lock_jobs_of(tg for tg, _ in reports)
        stopping = {*JOB_TERMINAL, JobStatus.CANCELING, JobStatus.FAILING}
        jobs = [job for job in jobs if job.status not in stopping]
        open_jobs = {job.id for job in jobs}
        wanted = sorted((tg, at) for tg, at in reports if job_of.get(tg) in open_jobs)
        if not wanted:
            return answers
        with connection.cursor() as cur:
            cur.execute(
                """
                UPDATE engine_taskgroup t SET status = %(running)s, updated_at = now()
                  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS r(id, attempt),
                       engine_member m
                 WHERE t.id = r.id AND t.attempt = r.attempt AND t.member_id = %(member)s
                   AND t.status = %(deploying)s AND m.id = t.member_id AND m.state = %(alive)s
             RETURNING t.id, t.attempt
                """,
                {
                    "running": ExecutionStatus.RUNNING,
                    "deploying": ExecutionStatus.DEPLOYING,
                    "alive": MemberState.ALIVE,
                    "member": member_id,
                    "ids": [tg for tg, _ in wanted],
                    "attempts": [at for _, at in wanted],
                },
            )
            started = {(row[0], row[1]) for row in cur.fetchall()}
        answers.update(dict.fromkeys(started, True))
        if len(started) < len(wanted):  # a repeated report of what already holds is True
            again = {key for key in wanted if key not in started}
            running = (
                TaskGroup.objects.on_alive_members()
                .filter(
                    id__in={tg for tg, _ in again},
                    member_id=member_id,
                    status=ExecutionStatus.RUNNING,
                )
                .values_list("id", "attempt")
            )
            answers.update({key: True for key in running if key in again})
        if not started:
            return answers
        events = []
        for job in jobs:
            mine = sorted(key for key in started if job_of[key[0]] == job.id)
            if not mine:
                continue
            events += [
                builders.taskgroup_status(
                    job.id, tg, at, ExecutionStatus.DEPLOYING, ExecutionStatus.RUNNING
                )
                for tg, at in mine
            ]
            events += rollup.settle_job(job)
        append_events(events)
    return answers


def owns(task_group_id: int, attempt: int, member_id: int) -> bool:
    """This attempt of the task group still belongs to this member and has not ended."""
    return (
        TaskGroup.objects.live()
        .filter(id=task_group_id, attempt=attempt, member_id=member_id)
        .exists()
    )


def readers_live(pipeline_id: int) -> bool:
    """Some reader of the pipeline has not ended, or failed and waits for a reader restore
    (failed in a RUNNING pipeline: engine.jobs.rollup), so its enumerator keeps its slot."""
    waiting = Q(status=ExecutionStatus.FAILED, pipeline__status=ExecutionStatus.RUNNING)
    return (
        TaskGroup.objects.filter(pipeline_id=pipeline_id, kind=TaskGroupKind.READER)
        .filter(Q(status__in=EXECUTION_LIVE) | waiting)
        .exists()
    )


def enumerators_checked(member_id: int, enumerators: list[tuple[int, int, int]]) -> dict:
    """For each (task group id, attempt, pipeline id) of an enumerator on ``member_id``, by
    (task group id, attempt): (still this member's live attempt, some reader of its pipeline
    live), in one statement
    for every enumerator of the member (they ask every ``ENUMERATOR_CHECK_INTERVAL``)."""
    if not enumerators:
        return {}
    ids, attempts, pipelines = (list(column) for column in zip(*enumerators, strict=True))
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT e.id, e.attempt,
                   EXISTS (SELECT 1 FROM engine_taskgroup t
                            WHERE t.id = e.id AND t.attempt = e.attempt
                              AND t.member_id = %(member)s AND t.status = ANY(%(live)s)),
                   EXISTS (SELECT 1 FROM engine_taskgroup r
                            WHERE r.pipeline_id = e.pipeline AND r.kind = %(reader)s
                              AND r.status = ANY(%(live)s))
              FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(pipelines)s::bigint[])
                   AS e(id, attempt, pipeline)
            """,
            {
                "member": member_id,
                "live": sorted(EXECUTION_LIVE),
                "reader": TaskGroupKind.READER,
                "ids": ids,
                "attempts": attempts,
                "pipelines": pipelines,
            },
        )
        return {(row[0], row[1]): (row[2], row[3]) for row in cur.fetchall()}


#: A task group's counts as it ends: rows read and written, rows per second, busy and CPU
#: seconds, then bytes read and written, then seconds blocked on its sinks (a report without
#: these counts none).
Metrics = (
    tuple[int, int, float, float, float]
    | tuple[int, int, float, float, float, int, int]
    | tuple[int, int, float, float, float, int, int, float]
)


def report_metrics(
    task_group_id: int,
    attempt: int,
    member_id: int,
    received: int,
    written: int,
    rows_per_second: float,
    source_runtime: dict | None = None,
    received_bytes: int = 0,
    written_bytes: int = 0,
    busy_seconds: float | None = None,
    blocked_seconds: float | None = None,
) -> bool:
    """Hot path: one conditional update, no event, no job lock. ``source_runtime``: a Lane A
    task group's runtime metrics; ``busy_seconds``, ``blocked_seconds``: a reader's times so
    far (each kept as it is when None)."""
    extra = {} if source_runtime is None else {"source_runtime": source_runtime}
    if busy_seconds is not None:
        extra["busy_seconds"] = busy_seconds
    if blocked_seconds is not None:
        extra["blocked_seconds"] = blocked_seconds
    return (
        TaskGroup.objects.live()
        .on_alive_members()
        .filter(id=task_group_id, attempt=attempt, member_id=member_id)
        .update(
            source_received=received,
            sink_written=written,
            source_received_bytes=received_bytes,
            sink_written_bytes=written_bytes,
            rows_per_second=rows_per_second,
            updated_at=Now(),
            **extra,
        )
        == 1
    )


def _running_attempt(task_group_id: int, attempt: int, member_id: int):
    """The task group's row while this attempt runs it on its (alive) member: the fence of
    a running attempt's own writes."""
    return TaskGroup.objects.on_alive_members().filter(
        id=task_group_id, attempt=attempt, member_id=member_id, status=ExecutionStatus.RUNNING
    )


def mark_input_ended(task_group_id: int, attempt: int, member_id: int) -> bool:
    """A checkpointed batch reader read all its input (the master triggers its final
    checkpoint at once); False if this attempt is no longer ours."""
    mine = _running_attempt(task_group_id, attempt, member_id)
    return mine.filter(input_ended_at__isnull=True).update(input_ended_at=Now()) == 1


def request_checkpoint(task_group_id: int, attempt: int, member_id: int) -> bool:
    """A Lane A reader wants a checkpoint now (a schema change or a graceful close waits for
    one): the master triggers one at its next step. Durable, so a master failover keeps the
    request; False if this attempt is no longer ours."""
    mine = _running_attempt(task_group_id, attempt, member_id)
    return mine.update(checkpoint_requested_at=Now()) == 1


def finish_task_group(
    task_group_id: int,
    attempt: int,
    member_id: int | None,
    status: str,
    error: str = "",
    metrics: Metrics | None = None,
    lost_member_id: int | None = None,
    planned: bool = False,
) -> bool:
    """A task group ends (FINISHED, FAILED or CANCELED): it lets go of its slot (freed, and
    no longer named by it: the scheduler may give it to another job at once), roll up.
    Idempotent.

    ``lost_member_id``: it failed because that member was lost (its pipeline may restore);
    ``planned``: the master moved it off that member because an operator drained it.
    """
    with transaction.atomic():
        job = _lock_job_of(task_group_id)
        if job is None:
            return False
        ending = Ending(error, metrics, lost_member_id, planned)
        failures: list[exceptions.Failure] = []
        events = _end_group(job, task_group_id, attempt, member_id, status, ending, failures)
        if events is None:
            return False
        exceptions.record(failures)  # before the roll-up: a restore it requests marks them
        append_events(events + rollup.settle_job(job))
    return True


#: How a member's task group ended: (task group id, attempt, status, error, metrics), and
#: for a failure its traceback after them.
Ended = tuple[int, int, str, str, Metrics | None] | tuple[int, int, str, str, Metrics | None, str]


def finish_task_groups(member_id: int, endings: list[Ended]) -> dict[Ended, bool]:
    """finish_task_group for several task groups of one member in one transaction: the jobs
    locked in id order (the lock order), each rolled up once, the events appended last (a
    worker whose task groups a storm cancels reports them together, engine.member.reports).
    Each answers as finish_task_group would."""
    answers = dict.fromkeys(endings, False)
    failures: list[exceptions.Failure] = []
    with transaction.atomic():
        job_of, jobs = _lock_jobs_of(e[0] for e in endings)
        events: list = []
        for job in jobs:
            ended: list = []
            mine = [e for e in endings if job_of.get(e[0]) == job.id]
            for ending in sorted(mine, key=lambda e: (e[0], e[1])):
                tg, attempt, status, error, metrics, *trace = ending
                end = Ending(error, metrics, traceback="".join(trace))
                made = _end_group(job, tg, attempt, member_id, status, end, failures)
                if made is not None:
                    answers[ending] = True
                    ended += made
            if ended:
                events += ended + rollup.settle_job(job)
        # Once for every job, after their roll-ups: a worker's own failure never restores its
        # pipeline (only member losses do), so no roll-up here marks one of these.
        exceptions.record(failures)
        append_events(events)
    return answers


def fail_lost_task_groups(job_id: int, lost: list[tuple[int, int, int, str]]) -> list:
    """The master fails task groups of ``job_id`` whose member is gone, each (task group id,
    attempt, lost member id, reason), in the caller's (fenced) transaction: the job is locked
    and rolled up once, whatever the number of groups. Returns the events, for the caller to
    append once, last, for every job of its transaction (engine.events: the append lock is
    taken last, or a worker holding a job row would wait for it while we wait for that row)."""
    job = Job.objects.select_for_update(no_key=True).filter(id=job_id).first()
    if job is None:
        return []
    events: list = []
    failures: list[exceptions.Failure] = []
    for task_group_id, attempt, lost_member_id, reason in lost:
        ending = Ending(reason, lost_member_id=lost_member_id)
        ended = _end_group(
            job, task_group_id, attempt, None, ExecutionStatus.FAILED, ending, failures
        )
        events += ended or []
    if not events:
        return []
    exceptions.record(failures)  # before the roll-up: the restore it requests marks them
    return events + rollup.settle_job(job)


@dataclass(frozen=True)
class Ending:
    """How a task group ends, beyond its status (finish_task_group's arguments)."""

    error: str = ""
    metrics: Metrics | None = None
    lost_member_id: int | None = None
    planned: bool = False
    #: A worker's failure: the traceback of what failed it.
    traceback: str = ""


def _end_group(
    job: Job,
    task_group_id: int,
    attempt: int,
    member_id: int | None,
    status: str,
    end: Ending,
    failures: list[exceptions.Failure],
) -> list | None:
    """End one task group of ``job`` (locked by the caller): its event, or None if this attempt
    had ended already (or is not ``member_id``'s). A failure is added to ``failures``, for the
    caller to record with the others that end in its transaction (engine.jobs.exceptions); a
    planned move off a drained member is no failure of the task group's."""
    error, metrics, lost_member_id = exceptions.redact(end.error), end.metrics, end.lost_member_id
    planned = end.planned
    query = TaskGroup.objects.select_for_update(no_key=True, of=("self",)).filter(
        id=task_group_id, attempt=attempt, job_id=job.id
    )
    if member_id is not None:  # a member reports: only while it owns the group and lives
        query = query.on_alive_members().filter(member_id=member_id)
    group = query.first()
    if group is None or group.status in EXECUTION_TERMINAL:
        return None
    check_transition(EXECUTION_TRANSITIONS, group.status, status)
    previous, group.status = group.status, status
    group.error_msg = error[:4000]
    group.lost_member_id = lost_member_id
    group.planned_move = planned and lost_member_id is not None
    held, group.slot_id = group.slot_id, None
    fields = ["status", "error_msg", "updated_at", "lost_member", "planned_move", "slot"]
    group.updated_at = Now()
    if metrics is not None:
        (
            group.source_received,
            group.sink_written,
            group.rows_per_second,
            group.busy_seconds,
            group.cpu_seconds,
            *moved,
        ) = metrics
        (group.source_received_bytes, group.sink_written_bytes, group.blocked_seconds) = (
            *moved,
            *(0, 0, 0.0)[len(moved) :],
        )
        fields += [
            "source_received",
            "sink_written",
            "rows_per_second",
            "busy_seconds",
            "cpu_seconds",
            "source_received_bytes",
            "sink_written_bytes",
            "blocked_seconds",
        ]
    group.save(update_fields=fields)
    if held:
        slot_transitions.free(held)
    if status == ExecutionStatus.FAILED and not group.planned_move:
        failures.append(
            exceptions.Failure(
                job.id,
                group.id,
                attempt,
                lost_member_id or group.member_id,
                error,
                end.traceback,
                member_lost=lost_member_id is not None,
            )
        )
    return [
        builders.taskgroup_status(
            job.id, group.id, attempt, previous, status, member_id=group.member_id, error=error
        )
    ]
