"""Graceful close of Lane A readers before a member drain moves them
(docs/decisions/0048-graceful-close-on-drain.md).

Moving a reader fails it as lost and restores it from the latest completed checkpoint, so a
reader moved while it reads reads again every row it read since. A drain first asks each of
the member's RUNNING Lane A readers of a checkpointing pipeline to close gracefully
(GRACEFUL_CLOSE): it stops polling, its next snapshot is its last, and once that checkpoint is
committed it reports ``gracefulClose: {attempt, checkpoint}`` in its runtime metrics (a report
fenced by member and attempt). The job's task groups on the member are moved once every such
reader has reported, and the restore then starts from a checkpoint holding where each one
stopped: nothing is read twice. When a pipeline's enumerator is on the member, moving it
restores the whole pipeline, so every Lane A reader of that pipeline, on any member, is closed
first.

The intent is the DRAINING drain row itself, re-read at every step, and the bound is measured
from the drain's start (or the reader's deployment, if later) by the database's clock: a new
active master goes on where the last one stopped. The close is sent again every RESEND seconds
until the reader's report shows it (the reader admits it once an attempt). A reader that has
not closed within ``engine.drain.graceful-close-timeout`` (at least three of its job's
checkpoint intervals) is moved anyway, as before: rows read since its latest checkpoint are
read again, and the sinks still commit each once. The wait also ends EXPIRY_MARGIN before the
drain's own expiry, so the move comes first; a drain that expires anyway (no master stepped in
time) restores the readers that had closed (``stranded``): a closed reader never reads again by
itself.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from engine.jobs.scheduler import Deployment
from engine.models import Job, MemberDrain, TaskGroup
from engine.states import ExecutionStatus, JobStatus, TaskGroupKind

log = logging.getLogger("keel.drain")

#: How often the close is sent again to a reader whose report does not show it yet.
RESEND = 1.0
#: How long before the drain's expiry the wait for closes ends, so the move comes first.
EXPIRY_MARGIN = 5.0
#: Statuses of an enumerator a drain moves (engine.jobs.drain.MOVABLE).
MOVABLE = (ExecutionStatus.DEPLOYING, ExecutionStatus.RUNNING)
#: The values each candidate reader is read from: its Deployment, then what decides.
FIELDS = (
    *Deployment.FIELDS,
    "deployed_at",
    "source_runtime",
    "pipeline__status",
    "pipeline__plan",  # its lane (a drain is rare: the plan is read whole)
)


def timeout_for(job: Job) -> float:
    """Seconds a drain waits for ``job``'s readers to close (0: not at all)."""
    option = settings.ENGINE["drain.graceful-close-timeout"]
    if option <= 0:
        return 0.0
    interval = (job.env.get("checkpoint.interval") or 0) / 1000
    return max(option, 3 * interval)


@dataclass
class Plan:
    """What the drain does with one job's task groups on the member this step."""

    #: Readers still closing: while any is, the job's task groups there wait.
    waiting: int = 0
    #: Those of them whose report does not show the close yet: it is sent (again).
    unanswered: list[Deployment] = field(default_factory=list)
    #: Readers that closed: task group id -> the checkpoint their last snapshot is in.
    closed: dict[int, int] = field(default_factory=dict)

    def why(self, task_group_id: int) -> str:
        checkpoint = self.closed.get(task_group_id)
        return "" if checkpoint is None else f"; closed gracefully at checkpoint {checkpoint}"


def enumerated_on(member_id: int, job: Job | None = None) -> dict[int, int]:
    """Pipelines whose live enumerator is on the member: pipeline id -> its task group id."""
    rows = TaskGroup.objects.filter(
        member_id=member_id, kind=TaskGroupKind.ENUMERATOR, status__in=MOVABLE
    )
    if job is not None:
        rows = rows.filter(job=job)
    return dict(rows.values_list("pipeline_id", "id"))


def plan(job: Job, drain: MemberDrain, now: datetime) -> Plan:
    """The job's Lane A readers on the drained member, and every one of a pipeline whose
    enumerator is there (moving it restores the whole pipeline): which still close, which
    closed (the job row is locked by the caller). ``now``: the database's clock."""
    out = Plan()
    if job.status != JobStatus.RUNNING or not (job.env.get("checkpoint.interval") or 0) > 0:
        return out
    bound = timeout_for(job)
    if bound <= 0:
        return out
    enumerated = enumerated_on(drain.member_id, job)
    rows = (
        TaskGroup.objects.filter(
            job=job,
            kind=TaskGroupKind.READER,
            status=ExecutionStatus.RUNNING,
            input_ended_at__isnull=True,  # at the end of its input: it finishes by itself
        )
        .filter(Q(member_id=drain.member_id) | Q(pipeline_id__in=list(enumerated)))
        .values_list(*FIELDS)
    )
    # The move must come before the drain expires (an expired drain moves nothing).
    expiry = drain.expires_at - timedelta(seconds=EXPIRY_MARGIN)
    for row in rows:
        target = Deployment.of(row)
        deployed_at, runtime, pipeline_status, plan_json = row[len(Deployment.FIELDS) :]
        lane = ((plan_json or {}).get("sourceRuntime") or {}).get("lane")
        if lane != "A" or pipeline_status != ExecutionStatus.RUNNING:
            continue  # Lane B, or a pipeline restoring: moved as before
        report = (runtime or {}).get("gracefulClose") or {}
        mine = report.get("attempt") == target.attempt
        if mine and report.get("checkpoint") is not None:
            out.closed[target.task_group_id] = report["checkpoint"]
            continue
        since = max(drain.created_at, deployed_at or drain.created_at)
        if now < min(since + timedelta(seconds=bound), expiry):
            out.waiting += 1
            if not mine:
                out.unanswered.append(target)
            continue
        log.warning(
            "drain of member %s: task group %s attempt %s did not close within %gs (or before "
            "the drain expires); moved anyway (what it read since its latest checkpoint is read "
            "again)",
            drain.member_id,
            target.task_group_id,
            target.attempt,
            bound,
        )
    return out


def stranded(drain: MemberDrain) -> dict[int, set[int]]:
    """At a drain's expiry: the live task groups on its member to move so that every reader
    the drain closed restores (job id -> task group ids). A closed reader (its report shows the
    close for its current attempt) polls no more and never ends by itself: left alone, a
    streaming job would silently stop reading its splits and a batch job never finish. One on
    the member is moved itself; one elsewhere (its pipeline's enumerator is on the member) by
    moving that enumerator, which restores the whole pipeline."""
    enumerated = enumerated_on(drain.member_id)
    rows = (
        TaskGroup.objects.filter(
            kind=TaskGroupKind.READER,
            status=ExecutionStatus.RUNNING,
            source_runtime__has_key="gracefulClose",
        )
        .filter(Q(member_id=drain.member_id) | Q(pipeline_id__in=list(enumerated)))
        .values_list("id", "attempt", "job_id", "pipeline_id", "member_id", "source_runtime")
    )
    out: dict[int, set[int]] = {}
    for group_id, attempt, job_id, pipeline_id, member_id, runtime in rows:
        if (runtime.get("gracefulClose") or {}).get("attempt") != attempt:
            continue  # a close asked of an earlier attempt: this one reads
        here = member_id == drain.member_id
        out.setdefault(job_id, set()).add(group_id if here else enumerated[pipeline_id])
    return out


class Resends:
    """When each reader attempt was last sent the close, so a step sends it at most every
    RESEND seconds. Memory only: it paces messages, the intent is the drain row, and a new
    master simply sends at once."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, int], float] = {}

    def due(self, targets: list[Deployment], clock=time.monotonic) -> list[Deployment]:
        """Of the readers waiting for their close now, those to send it to; the others are
        forgotten."""
        now = clock()
        keys = {(t.task_group_id, t.attempt) for t in targets}
        self.sent = {key: at for key, at in self.sent.items() if key in keys}
        out = []
        for target in targets:
            key = (target.task_group_id, target.attempt)
            if key not in self.sent or now - self.sent[key] >= RESEND:
                self.sent[key] = now
                out.append(target)
        return out


resends = Resends()
