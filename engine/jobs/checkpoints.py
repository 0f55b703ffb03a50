"""Checkpoint coordination (active master) and acknowledgement (task groups).

Every ``checkpoint.interval`` ms the active master triggers checkpoint N for each RUNNING
pipeline that has none in flight: a Checkpoint row naming the attempts it expects, then a barrier
command to each task group. A task group handles the barrier between two batches (so the cut is
ordered with its data): it snapshots its reader positions and its sinks' pre-commit states,
persists them with its attempt, and so acknowledges. When every expected attempt has acked, N is
COMPLETED and readers are told to commit their sinks' state; ``checkpoint.timeout`` (or the
pipeline leaving RUNNING) makes it FAILED, and the next one starts fresh.

The barriers are re-stated by the row: a master that finds a PENDING checkpoint another master
triggered sends its missing barriers at once (that master may have died before they went out),
and any master re-sends them every BARRIER_RESEND seconds until acked. A task group handles a
checkpoint's barrier once, so a re-sent barrier never moves the cut.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max, Q
from django.db.models.functions import Now

from engine import counters
from engine import events as builders
from engine.events import append_events
from engine.fencing import fenced
from engine.jobs.scheduler import Deployment
from engine.models import Checkpoint, EngineEvent, Pipeline, TaskCheckpoint, TaskGroup
from engine.states import CheckpointState, ExecutionStatus, JobStatus, TaskGroupKind

log = logging.getLogger("keel.checkpoints")
BARRIER_RESEND = 2.0
#: How soon a reader's final checkpoint is tried again after one failed (not a whole interval).
FINAL_RETRY = 1.0


def database_now():
    """The database's clock: every time this module compares is one PostgreSQL wrote, and the
    master's own clock may be off by any amount."""
    with connection.cursor() as cur:
        cur.execute("SELECT statement_timestamp()")
        return cur.fetchone()[0]


def trigger_due(epoch: int) -> list[tuple[int, Deployment]]:
    """Start a checkpoint for every RUNNING pipeline whose interval has passed, or one of whose
    readers read all its input since the last one (its final checkpoint; if that one fails,
    again after FINAL_RETRY rather than a whole interval). Returns the barriers to send once
    committed: (checkpoint id, task group attempt)."""
    now = database_now()
    candidates = (
        Pipeline.objects.filter(status=ExecutionStatus.RUNNING, job__status=JobStatus.RUNNING)
        .exclude(checkpoints__state=CheckpointState.PENDING)
        .annotate(
            last=Max("checkpoints__triggered_at"),
            input_ended=Max(
                "task_groups__input_ended_at",
                filter=Q(task_groups__status=ExecutionStatus.RUNNING),
            ),
            last_completed=Max(
                "checkpoints__triggered_at",
                filter=Q(checkpoints__state=CheckpointState.COMPLETED),
            ),
        )
        .select_related("job")
    )
    due = []
    for pipeline in candidates:
        interval = pipeline.job.env.get("checkpoint.interval") or 0
        if interval <= 0:
            continue
        # A reader that read all its input ends only after a checkpoint triggered since
        # completes (its final checkpoint).
        final_owed = pipeline.input_ended is not None and (
            pipeline.last_completed is None or pipeline.last_completed < pipeline.input_ended
        )
        if (
            pipeline.last is None
            or pipeline.last <= now - timedelta(milliseconds=interval)
            or (
                final_owed
                and (
                    pipeline.input_ended >= pipeline.last
                    or pipeline.last <= now - timedelta(seconds=FINAL_RETRY)
                )
            )
        ):
            due.append(pipeline)
    if not due:
        return []
    barriers: list[tuple[int, Deployment]] = []
    events: list[EngineEvent] = []
    with fenced(epoch):
        for pipeline in due:
            groups = list(
                # A lost member's task group is failing anyway.
                TaskGroup.objects.on_alive_members()
                .filter(pipeline=pipeline, status=ExecutionStatus.RUNNING)
                .values_list(*Deployment.FIELDS)
            )
            # A FINISHED reader committed all it read (after its final checkpoint): it takes
            # no more barriers. Any other task group not running makes this no time for one.
            unfinished = (
                TaskGroup.objects.filter(pipeline=pipeline)
                .exclude(status=ExecutionStatus.FINISHED)
                .count()
            )
            if not groups or len(groups) != unfinished:
                continue
            targets = [Deployment.of(row) for row in groups]
            checkpoint = Checkpoint.objects.create(
                job_id=pipeline.job_id,
                pipeline=pipeline,
                expected={str(g.task_group_id): g.attempt for g in targets},
                barrier_epoch=epoch,
                barriers_sent_at=Now(),
            )
            barriers += [(checkpoint.id, g) for g in targets]
            events.append(
                builders.checkpoint_triggered(pipeline.job_id, epoch, checkpoint.id, pipeline.index)
            )
        append_events(events)
    return barriers


def unacked_barriers(epoch: int) -> list[tuple[int, Deployment]]:
    """The barriers of PENDING checkpoints still waiting for an ack, to send again: every one
    of a checkpoint last sent under another epoch, and the others every BARRIER_RESEND seconds
    (a dropped message, a full mailbox, a broker outage)."""
    cutoff = Now() - timedelta(seconds=BARRIER_RESEND)  # compared by the database's clock
    with fenced(epoch):
        due = list(
            Checkpoint.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(state=CheckpointState.PENDING)
            .filter(~Q(barrier_epoch=epoch) | Q(barriers_sent_at__lt=cutoff))
            .order_by("id")
            .values_list("id", "expected")[:500]
        )
        if not due:
            return []
        ids = [checkpoint_id for checkpoint_id, _ in due]
        Checkpoint.objects.filter(id__in=ids).update(barrier_epoch=epoch, barriers_sent_at=Now())
        acked = set(
            TaskCheckpoint.objects.filter(checkpoint_id__in=ids).values_list(
                "checkpoint_id", "task_group_id"
            )
        )
    waiting = {
        (int(group_id), attempt): checkpoint_id
        for checkpoint_id, expected in due
        for group_id, attempt in expected.items()
        if (checkpoint_id, int(group_id)) not in acked
    }
    targets = (
        Deployment.of(row)
        for row in TaskGroup.objects.on_alive_members()
        .filter(id__in={group_id for group_id, _ in waiting}, status=ExecutionStatus.RUNNING)
        .values_list(*Deployment.FIELDS)
    )
    return [
        (waiting[key], target)
        for target in targets
        if (key := (target.task_group_id, target.attempt)) in waiting
    ]


def acknowledge(checkpoint_id: int, task_group_id: int, attempt: int, state: dict) -> bool:
    """A task group's snapshot for checkpoint N: True once it is recorded for this attempt.

    One ack per task group: a second one of the same attempt (a retry after a commit whose
    answer was lost) answers True, even if the checkpoint has ended since, and keeps the first
    snapshot; another attempt's answers False."""

    def recorded() -> bool:
        return TaskCheckpoint.objects.filter(
            checkpoint_id=checkpoint_id, task_group_id=task_group_id, attempt=attempt
        ).exists()

    try:
        with transaction.atomic():
            if recorded():
                return True
            pending = Checkpoint.objects.filter(
                id=checkpoint_id, state=CheckpointState.PENDING
            ).exists()
            if not pending:
                return False
            TaskCheckpoint.objects.create(
                checkpoint_id=checkpoint_id,
                task_group_id=task_group_id,
                attempt=attempt,
                state=state,
            )
        return True
    except IntegrityError:
        return recorded()


def complete_or_expire(
    epoch: int, on_completed: Callable[[Checkpoint], object] = lambda checkpoint: None
) -> int:
    """COMPLETE checkpoints every expected attempt acked; FAIL those timed out or orphaned.
    ``on_completed`` is called as soon as each COMPLETED one has committed, before the next
    one is ended (its commits must go out even if a later one fails). Returns how many ended."""
    pending = list(
        Checkpoint.objects.filter(state=CheckpointState.PENDING).select_related("pipeline", "job")
    )
    ended = 0
    now = database_now()
    for checkpoint in pending:
        acks = {
            (str(tg), a)
            for tg, a in TaskCheckpoint.objects.filter(checkpoint=checkpoint).values_list(
                "task_group_id", "attempt"
            )
        }
        expected = {(tg, a) for tg, a in checkpoint.expected.items()}
        timeout = timedelta(milliseconds=checkpoint.job.env.get("checkpoint.timeout") or 60000)
        groups = TaskGroup.objects.filter(pipeline_id=checkpoint.pipeline_id).values_list(
            "id", "attempt", "status"
        )
        current = {(str(tg), a) for tg, a, _ in groups}
        # A reader that FINISHED after the barrier went out committed all it read (its final
        # checkpoint came before): it owes no ack, and a restore leaves its splits done.
        finished = {(str(tg), a) for tg, a, status in groups if status == ExecutionStatus.FINISHED}
        if not expected <= current:
            state, reason = CheckpointState.FAILED, "a task group was redeployed before every ack"
        elif checkpoint.job.status in (JobStatus.CANCELING, JobStatus.CANCELED):
            # Its readers commit what completed as they stop: nothing may complete after.
            state, reason = CheckpointState.FAILED, "job cancelled before every commit"
        elif expected <= acks | finished:
            state, reason = CheckpointState.COMPLETED, ""
        elif checkpoint.pipeline.status != ExecutionStatus.RUNNING:
            state = CheckpointState.FAILED
            reason = f"pipeline {checkpoint.pipeline.status} before every ack"
        elif checkpoint.triggered_at < now - timeout:
            state, reason = CheckpointState.FAILED, "checkpoint timeout"
        else:
            continue
        state = _end(epoch, checkpoint, state, reason)
        if state is not None:
            ended += 1
            if state == CheckpointState.COMPLETED:
                on_completed(checkpoint)
    return ended


def _end(epoch: int, checkpoint: Checkpoint, state: str, reason: str = "") -> str | None:
    """End a PENDING checkpoint; returns the state it ended in (None: it had ended already).

    Under its pipeline's row lock, the lock a restore takes: a checkpoint completes only if
    its attempts are still the pipeline's (else it FAILS), so a restore and the completion it
    races are ordered, and the checkpoint the restore rewinds to is the newest completed one
    as its new readers find it."""
    with fenced(epoch):
        Pipeline.objects.select_for_update(no_key=True).filter(id=checkpoint.pipeline_id).first()
        if state == CheckpointState.COMPLETED and not _attempts_current(checkpoint):
            state, reason = CheckpointState.FAILED, "a task group was redeployed before every ack"
        changed = Checkpoint.objects.filter(id=checkpoint.id, state=CheckpointState.PENDING).update(
            state=state, ended_at=Now(), failure_reason=reason
        )
        if changed != 1:
            return None
        completed = state == CheckpointState.COMPLETED
        counters.checkpoint_ended(
            completed, (database_now() - checkpoint.triggered_at).total_seconds()
        )
        counter = (
            "checkpoints_completed" if state == CheckpointState.COMPLETED else "checkpoints_failed"
        )
        Pipeline.objects.filter(id=checkpoint.pipeline_id).update(**{counter: F(counter) + 1})
        append_events(
            [
                builders.checkpoint_ended(
                    checkpoint.job_id,
                    epoch,
                    checkpoint.id,
                    checkpoint.pipeline.index,
                    state,
                    reason,
                )
            ]
        )
        if state == CheckpointState.COMPLETED:
            _prune(checkpoint)
    return state


def _attempts_current(checkpoint: Checkpoint) -> bool:
    current = {
        (str(group_id), attempt)
        for group_id, attempt in TaskGroup.objects.filter(
            pipeline_id=checkpoint.pipeline_id
        ).values_list("id", "attempt")
    }
    return set(checkpoint.expected.items()) <= current


def _prune(checkpoint: Checkpoint) -> None:
    """Keep ``checkpoint.max-retained`` completed checkpoints (and no older failed ones)."""
    keep = int(checkpoint.job.env.get("checkpoint.max-retained") or 3)
    completed = list(
        Checkpoint.objects.filter(pipeline=checkpoint.pipeline, state=CheckpointState.COMPLETED)
        .order_by("-id")
        .values_list("id", flat=True)
    )
    if len(completed) > keep:
        oldest_kept = completed[keep - 1]
        Checkpoint.objects.filter(pipeline=checkpoint.pipeline, id__lt=oldest_kept).filter(
            ~Q(state=CheckpointState.PENDING)
        ).delete()


def committers(checkpoint: Checkpoint) -> list[Deployment]:
    """The readers to tell that ``checkpoint`` completed. A reader that misses it (its member
    died) commits on restore instead: the new attempt completes the commit of the checkpoint
    it restores from."""
    return [
        Deployment.of(row)
        for row in TaskGroup.objects.on_alive_members()
        .filter(
            pipeline_id=checkpoint.pipeline_id,
            kind=TaskGroupKind.READER,
            status=ExecutionStatus.RUNNING,
        )
        .values_list(*Deployment.FIELDS)
    ]


def latest_completed(pipeline_id: int) -> Checkpoint | None:
    return (
        Checkpoint.objects.filter(pipeline_id=pipeline_id, state=CheckpointState.COMPLETED)
        .order_by("-id")
        .first()
    )


def reader_state(checkpoint: Checkpoint, task_group_id: int) -> dict:
    ack = TaskCheckpoint.objects.filter(checkpoint=checkpoint, task_group_id=task_group_id).first()
    return ack.state if ack else {}


def acked_states(checkpoint_id: int, task_group_ids: list[int]) -> dict[int, dict]:
    """What these task groups hold as of a completed checkpoint, by task group id: each one's
    snapshot in it, or, for one that owed no ack (it had FINISHED, its final checkpoint
    before), its newest snapshot in an earlier completed checkpoint."""
    rows = (
        TaskCheckpoint.objects.filter(
            checkpoint_id__lte=checkpoint_id,
            checkpoint__state=CheckpointState.COMPLETED,
            task_group_id__in=task_group_ids,
        )
        .order_by("task_group_id", "-checkpoint_id")
        .distinct("task_group_id")
        .values_list("task_group_id", "state")
    )
    return dict(rows)


def completed_since(task_group_id: int, attempt: int, after: int) -> tuple[int, dict] | None:
    """The newest COMPLETED checkpoint after ``after`` that this attempt acked, and its
    snapshot: what its sinks must commit (committing it commits every earlier one too)."""
    return (
        TaskCheckpoint.objects.filter(
            checkpoint_id__gt=after,
            checkpoint__state=CheckpointState.COMPLETED,
            task_group_id=task_group_id,
            attempt=attempt,
        )
        .order_by("-checkpoint_id")
        .values_list("checkpoint_id", "state")
        .first()
    )


def record_commit(checkpoint_id: int, task_group_id: int, attempt: int) -> None:
    """The task group committed its sinks' state for ``checkpoint_id`` (and every earlier)."""
    TaskCheckpoint.objects.filter(
        checkpoint_id=checkpoint_id, task_group_id=task_group_id, attempt=attempt
    ).update(committed_at=Now())
