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

import json
import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta

from django.db import IntegrityError, connection
from django.db.models import Count, Max, Q
from django.db.models.functions import Now

from engine import counters
from engine import events as builders
from engine.events import append_events
from engine.fencing import fenced
from engine.jobs import checkpoint_history
from engine.jobs.checkpoint_reads import (  # re-exported: the task groups' side reads them here
    acked_after,
    acked_states,
    completed_since,
    latest_completed,
    reader_state,
    record_commit,
)
from engine.jobs.scheduler import Deployment
from engine.models import Checkpoint, Pipeline, TaskCheckpoint, TaskGroup
from engine.states import CheckpointState, ExecutionStatus, JobStatus, TaskGroupKind

__all__ = [
    "acked_after",
    "acked_states",
    "completed_since",
    "latest_completed",
    "reader_state",
    "record_commit",
]

log = logging.getLogger("keel.checkpoints")
BARRIER_RESEND = 2.0
#: How soon a reader's final checkpoint is tried again after one failed (not a whole interval).
FINAL_RETRY = 1.0
Told = Callable[[list[Checkpoint]], object]  # who is told of checkpoints that ended


def database_now():
    """The database's clock: every time this module compares is one PostgreSQL wrote, and the
    master's own clock may be off by any amount."""
    with connection.cursor() as cur:
        cur.execute("SELECT statement_timestamp()")
        return cur.fetchone()[0]


def trigger_due(epoch: int) -> list[tuple[int, Deployment]]:
    """Start a checkpoint for every RUNNING pipeline whose interval has passed, one of whose
    readers asked for one since the last (``request_checkpoint``), or one of whose
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
            requested=Max(
                "task_groups__checkpoint_requested_at",
                filter=Q(task_groups__status=ExecutionStatus.RUNNING),
            ),
        )
        .select_related("job")
        # Ten times a second under every running job: not their plans or configs.
        .only("id", "index", "job_id", "job__env")
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
        # A reader asked for one now (a schema change waits for it).
        asked = pipeline.requested is not None and (
            pipeline.last is None or pipeline.requested >= pipeline.last
        )
        if (
            pipeline.last is None
            or asked
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
    ids = [pipeline.id for pipeline in due]
    barriers: list[tuple[int, Deployment]] = []
    with fenced(epoch):
        running: dict[int, list[Deployment]] = defaultdict(list)
        for row in (
            # A lost member's task group is failing anyway.
            TaskGroup.objects.on_alive_members()
            .filter(pipeline_id__in=ids, status=ExecutionStatus.RUNNING)
            .values_list("pipeline_id", *Deployment.FIELDS)
        ):
            running[row[0]].append(Deployment.of(row[1:]))
        # A FINISHED reader committed all it read (after its final checkpoint): it takes no
        # more barriers. Any other task group not running makes this no time for one.
        unfinished = dict(
            TaskGroup.objects.filter(pipeline_id__in=ids)
            .exclude(status=ExecutionStatus.FINISHED)
            .values("pipeline_id")
            .annotate(n=Count("id"))
            .values_list("pipeline_id", "n")
        )
        ready = [p for p in due if running[p.id] and len(running[p.id]) == unfinished.get(p.id)]
        if not ready:
            return []
        created = Checkpoint.objects.bulk_create(
            Checkpoint(
                job_id=pipeline.job_id,
                pipeline=pipeline,
                expected={str(g.task_group_id): g.attempt for g in running[pipeline.id]},
                barrier_epoch=epoch,
                barriers_sent_at=Now(),
            )
            for pipeline in ready
        )
        for pipeline, checkpoint in zip(ready, created, strict=True):
            barriers += [(checkpoint.id, g) for g in running[pipeline.id]]
        append_events(
            builders.checkpoint_triggered(pipeline.job_id, epoch, checkpoint.id, pipeline.index)
            for pipeline, checkpoint in zip(ready, created, strict=True)
        )
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
    snapshot; another attempt's answers False. One statement, in autocommit: every task group
    of every running pipeline acks each checkpoint, and this was most of a worker's time."""
    text = json.dumps(state)
    try:
        with connection.cursor() as cur:
            cur.execute(
                _ACK,
                {
                    "checkpoint": checkpoint_id,
                    "group": task_group_id,
                    "attempt": attempt,
                    "state": text,
                    "size": len(text.encode()),
                    "pending": CheckpointState.PENDING,
                },
            )
            return bool(cur.fetchone()[0])
    except IntegrityError:  # its task group is gone (the job's state was cleaned up)
        return False


#: The ack (its size: the JSON's bytes), if the checkpoint is pending; True if this attempt's is.
_ACK = """
            WITH made AS (
                INSERT INTO engine_taskcheckpoint
                       (checkpoint_id, task_group_id, attempt, state, size_bytes)
                SELECT %(checkpoint)s, %(group)s, %(attempt)s, %(state)s, %(size)s
                 WHERE EXISTS (SELECT 1 FROM engine_checkpoint
                                WHERE id = %(checkpoint)s AND state = %(pending)s)
                ON CONFLICT (checkpoint_id, task_group_id) DO NOTHING
                RETURNING 1
            )
            SELECT EXISTS (SELECT 1 FROM made)
                OR EXISTS (SELECT 1 FROM engine_taskcheckpoint
                            WHERE checkpoint_id = %(checkpoint)s
                              AND task_group_id = %(group)s AND attempt = %(attempt)s)
"""


def complete_or_expire(
    epoch: int, on_completed: Told = lambda completed: None, on_failed: Told = lambda failed: None
) -> int:
    """COMPLETE checkpoints every expected attempt acked, FAIL those timed out or orphaned, in
    one read and one fenced transaction however many are pending; then ``on_completed`` and
    ``on_failed`` get each kind (no commit or abort goes out before). Returns how many ended."""
    pending = list(
        Checkpoint.objects.filter(state=CheckpointState.PENDING)
        .select_related("pipeline", "job")
        # Ten times a second under every running job: what a verdict needs, not their plans.
        .only(*VERDICT_FIELDS)
        .order_by("id")
    )
    verdicts = _verdicts(pending) if pending else []
    if not verdicts:
        return 0
    ended = _end(epoch, verdicts)
    if completed := [c for c, state in ended if state == CheckpointState.COMPLETED]:
        on_completed(completed)
    if failed := [c for c, state in ended if state == CheckpointState.FAILED]:
        on_failed(failed)
    return len(ended)


#: What judging and ending a pending checkpoint reads (``complete_or_expire``).
VERDICT_FIELDS = (
    "id",
    "job_id",
    "pipeline_id",
    "expected",
    "triggered_at",
    "job__status",
    "job__env",
    "pipeline__status",
    "pipeline__index",
)


def _verdicts(pending: list[Checkpoint]) -> list[tuple[Checkpoint, str, str]]:
    """How each pending checkpoint ends now, if it does: (checkpoint, state, reason)."""
    acks: dict[int, set[tuple[str, int]]] = defaultdict(set)
    for checkpoint_id, group_id, attempt in TaskCheckpoint.objects.filter(
        checkpoint_id__in=[c.id for c in pending]
    ).values_list("checkpoint_id", "task_group_id", "attempt"):
        acks[checkpoint_id].add((str(group_id), attempt))
    groups: dict[int, list[tuple[str, int, str]]] = defaultdict(list)
    for pipeline_id, group_id, attempt, status in TaskGroup.objects.filter(
        pipeline_id__in={c.pipeline_id for c in pending}
    ).values_list("pipeline_id", "id", "attempt", "status"):
        groups[pipeline_id].append((str(group_id), attempt, status))
    now = database_now()
    out = []
    for checkpoint in pending:
        expected = set(checkpoint.expected.items())
        timeout = timedelta(milliseconds=checkpoint.job.env.get("checkpoint.timeout") or 60000)
        current = {(tg, a) for tg, a, _ in groups[checkpoint.pipeline_id]}
        # A reader that FINISHED after the barrier went out committed all it read (its final
        # checkpoint came before): it owes no ack, and a restore leaves its splits done.
        finished = {
            (tg, a)
            for tg, a, status in groups[checkpoint.pipeline_id]
            if status == ExecutionStatus.FINISHED
        }
        if not expected <= current:
            state, reason = CheckpointState.FAILED, REDEPLOYED
        elif checkpoint.job.status in (JobStatus.CANCELING, JobStatus.CANCELED):
            # Its readers commit what completed as they stop: nothing may complete after.
            state, reason = CheckpointState.FAILED, "job cancelled before every commit"
        elif expected <= acks[checkpoint.id] | finished:
            state, reason = CheckpointState.COMPLETED, ""
        elif checkpoint.pipeline.status != ExecutionStatus.RUNNING:
            state = CheckpointState.FAILED
            reason = f"pipeline {checkpoint.pipeline.status} before every ack"
        elif checkpoint.triggered_at < now - timeout:
            state, reason = CheckpointState.FAILED, "checkpoint timeout"
        else:
            continue
        out.append((checkpoint, state, reason))
    return out


#: Why a checkpoint fails whose expected attempts are not all the pipeline's any more.
REDEPLOYED = "a task group was redeployed before every ack"

#: End the checkpoints still PENDING, each in its state with its reason; their ids.
_END = """
UPDATE engine_checkpoint c
   SET state = v.state, ended_at = statement_timestamp(), failure_reason = v.reason
  FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS v(id, state, reason)
 WHERE c.id = v.id AND c.state = %s
RETURNING c.id
"""

#: Add each pipeline's completed and failed checkpoints to its counts.
_COUNT = """
UPDATE engine_pipeline p
   SET checkpoints_completed = p.checkpoints_completed + v.completed,
       checkpoints_failed = p.checkpoints_failed + v.failed
  FROM unnest(%s::bigint[], %s::int[], %s::int[]) AS v(id, completed, failed)
 WHERE p.id = v.id
"""


def _end(epoch: int, verdicts: list[tuple[Checkpoint, str, str]]) -> list[tuple[Checkpoint, str]]:
    """End the checkpoints as judged; returns those this call ended, with their state.

    Under their pipelines' row locks, the locks a restore takes: a checkpoint completes only if
    its attempts are still the pipeline's (else it FAILS), so a restore and the completion it
    races are ordered, and the checkpoint the restore rewinds to is the newest completed one
    as its new readers find it. A pipeline another transaction holds is skipped, its
    checkpoints judged again next pass: the master never waits for a pipeline, so it cannot
    deadlock with a job's transaction that saved one pipeline and locks the rest in order."""
    with fenced(epoch):
        locked = set(
            Pipeline.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(id__in={c.pipeline_id for c, _, _ in verdicts})
            .order_by("id")
            .values_list("id", flat=True)
        )
        verdicts = [v for v in verdicts if v[0].pipeline_id in locked]
        pipelines = sorted(locked)
        current: dict[int, set[tuple[str, int]]] = defaultdict(set)
        for pipeline_id, group_id, attempt in TaskGroup.objects.filter(
            pipeline_id__in=pipelines
        ).values_list("pipeline_id", "id", "attempt"):
            current[pipeline_id].add((str(group_id), attempt))
        final = []
        for checkpoint, state, reason in verdicts:
            stale = not set(checkpoint.expected.items()) <= current[checkpoint.pipeline_id]
            if state == CheckpointState.COMPLETED and stale:
                state, reason = CheckpointState.FAILED, REDEPLOYED
            final.append((checkpoint, state, reason))
        with connection.cursor() as cur:
            cur.execute(
                _END,
                [
                    [c.id for c, _, _ in final],
                    [state for _, state, _ in final],
                    [reason for _, _, reason in final],
                    CheckpointState.PENDING,
                ],
            )
            changed = {row[0] for row in cur.fetchall()}
        ended = [verdict for verdict in final if verdict[0].id in changed]
        if not ended:
            return []
        now = database_now()
        completed = [c for c, state, _ in ended if state == CheckpointState.COMPLETED]
        counters.checkpoints_ended(
            (state == CheckpointState.COMPLETED, (now - c.triggered_at).total_seconds())
            for c, state, _ in ended
        )
        counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for checkpoint, state, _ in ended:
            counts[checkpoint.pipeline_id][0 if state == CheckpointState.COMPLETED else 1] += 1
        with connection.cursor() as cur:
            cur.execute(
                _COUNT,
                [list(counts), [c[0] for c in counts.values()], [c[1] for c in counts.values()]],
            )
        checkpoint_history.record(c for c, _, _ in ended)  # before the prune: it outlives it
        if completed:
            _prune(completed)
        append_events(  # the last write: it holds the event-append lock until the commit
            builders.checkpoint_ended(c.job_id, epoch, c.id, c.pipeline.index, state, reason)
            for c, state, reason in ended
        )
    return [(c, state) for c, state, _ in ended]


def _prune(completed: list[Checkpoint]) -> None:
    """Once a pipeline has more than ``checkpoint.max-retained`` completed checkpoints, keep
    that many newest (and no older failed ones): every pipeline that just completed one, in
    two statements."""
    keep = {c.pipeline_id: int(c.job.env.get("checkpoint.max-retained") or 3) for c in completed}
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT r.pipeline_id, min(r.id)
              FROM (SELECT c.pipeline_id, c.id,
                           row_number() OVER (PARTITION BY c.pipeline_id ORDER BY c.id DESC) AS n,
                           count(*) OVER (PARTITION BY c.pipeline_id) AS total
                      FROM engine_checkpoint c
                     WHERE c.pipeline_id = ANY(%s) AND c.state = %s) r
              JOIN unnest(%s::bigint[], %s::int[]) AS k(pipeline_id, keep)
                ON k.pipeline_id = r.pipeline_id
             WHERE r.n <= k.keep AND r.total > k.keep
             GROUP BY r.pipeline_id
            """,
            [list(keep), CheckpointState.COMPLETED, list(keep), list(keep.values())],
        )
        oldest_kept = cur.fetchall()
    if not oldest_kept:
        return
    older = Q()
    for pipeline_id, oldest in oldest_kept:
        older |= Q(pipeline_id=pipeline_id, id__lt=oldest)
    Checkpoint.objects.filter(older).filter(~Q(state=CheckpointState.PENDING)).delete()


def committers(completed: list[Checkpoint]) -> list[tuple[int, Deployment]]:
    """The readers to tell that these checkpoints completed, as (checkpoint id, reader), in
    one query. A reader that misses it (its member died) commits on restore instead: the new
    attempt completes the commit of the checkpoint it restores from."""
    by_pipeline = defaultdict(list)
    for checkpoint in completed:
        by_pipeline[checkpoint.pipeline_id].append(checkpoint.id)
    return [
        (checkpoint_id, Deployment.of(row[1:]))
        for row in TaskGroup.objects.on_alive_members()
        .filter(
            pipeline_id__in=list(by_pipeline),
            kind=TaskGroupKind.READER,
            status=ExecutionStatus.RUNNING,
        )
        .order_by("pipeline_id", "id")
        .values_list("pipeline_id", *Deployment.FIELDS)
        for checkpoint_id in by_pipeline[row[0]]
    ]
