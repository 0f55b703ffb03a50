"""Scheduling by the active master: PENDING jobs get slots in FIFO order, under row locks.

The head of the queue (oldest PENDING job that could ever fit) is scheduled when enough slots are
free; until then every later job waits too (FIFO: a big job is not starved by small ones). A job
needing more slots than the ALIVE members could ever give is passed over (``schedule_next``), and
so is one whose ``tag_filter`` no ALIVE member matches: its slots come only from members whose
tags hold every pair of the filter.
Slots of ALIVE members are taken with ``FOR NO KEY UPDATE SKIP LOCKED``, spread across members by
sequence; dynamic-slot members get new slot rows on demand. Deploy commands go out only after
the commit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db.models.functions import Now

from engine import counters
from engine import events as builders
from engine.cluster import slots as slot_transitions
from engine.events import append_events
from engine.fencing import fenced
from engine.jobs.envoptions import TAG_FILTER, describe_tags
from engine.models import EngineEvent, Job, Member, Pipeline, TaskGroup
from engine.protocol import COMMAND_BATCHES_SINCE
from engine.states import ExecutionStatus, JobStatus

log = logging.getLogger("keel.scheduler")


@dataclass(frozen=True)
class Deployment:
    """A task group attempt placed on a member: where its commands go."""

    task_group_id: int
    attempt: int
    member_name: str
    member_uuid: str
    #: The member takes commands batched in one message (engine.outbox).
    batched: bool = False

    #: The task-group values a Deployment is read from (``values_list(*Deployment.FIELDS)``).
    FIELDS = ("id", "attempt", "member__name", "member__uuid", "member__protocol_version")

    @classmethod
    def of(cls, row: tuple) -> Deployment:
        group_id, attempt, member_name, member_uuid, protocol_version = row[:5]
        return cls(
            group_id,
            attempt,
            member_name,
            str(member_uuid),
            (protocol_version or 0) >= COMMAND_BATCHES_SINCE,
        )


def deploy_on(
    groups: list[TaskGroup], slots: list[tuple[int, int]], epoch: int
) -> tuple[list[Deployment], list[EngineEvent]]:
    """Give each task group a slot and a new attempt, DEPLOYING, in one statement per table.

    Returns the deploy commands to send once the caller's transaction commits, and the
    ``taskgroup.status`` events for the caller to append with its own.
    """
    members = {
        pk: member
        for pk, *member in Member.objects.filter(id__in={m for _, m in slots}).values_list(
            "id", "name", "uuid", "protocol_version"
        )
    }
    slot_transitions.assign([s for s, _ in slots])
    # The counts of the attempts replaced are kept in the totals (Prometheus counters never
    # go down when a restore starts a task group's counts over), and in their job's own.
    counters.bump(
        [
            (counters.ROWS_RETIRED, "read", sum(g.source_received for g in groups)),
            (counters.ROWS_RETIRED, "written", sum(g.sink_written for g in groups)),
            (counters.BYTES_RETIRED, "read", sum(g.source_received_bytes for g in groups)),
            (counters.BYTES_RETIRED, "written", sum(g.sink_written_bytes for g in groups)),
            *(
                item
                for g in groups
                for item in (
                    (counters.JOB_ROWS_READ_RETIRED, str(g.job_id), g.source_received),
                    (counters.JOB_ROWS_WRITTEN_RETIRED, str(g.job_id), g.sink_written),
                )
            ),
        ]
    )
    deployments, events = [], []
    for group, (slot_id, member_id) in zip(groups, slots, strict=True):
        previous = group.status
        group.slot_id = group.last_slot_id = slot_id
        group.member_id = member_id
        group.status = ExecutionStatus.DEPLOYING
        group.attempt += 1
        group.error_msg = ""
        group.lost_member_id = None
        group.planned_move = False
        group.source_received = group.sink_written = 0
        group.source_received_bytes = group.sink_written_bytes = 0
        group.rows_per_second = group.busy_seconds = group.blocked_seconds = 0.0
        group.deployed_at = group.updated_at = Now()
        group.input_ended_at = group.checkpoint_requested_at = None
        deployments.append(Deployment.of((group.id, group.attempt, *members[member_id])))
        events.append(
            builders.taskgroup_status(
                group.job_id,
                group.id,
                group.attempt,
                previous,
                group.status,
                member_id=member_id,
                epoch=epoch,
                slot_id=slot_id,
            )
        )
    TaskGroup.objects.bulk_update(
        groups,
        [
            "slot",
            "last_slot",
            "member",
            "status",
            "attempt",
            "error_msg",
            "lost_member",
            "planned_move",
            "source_received",
            "sink_written",
            "source_received_bytes",
            "sink_written_bytes",
            "rows_per_second",
            "busy_seconds",
            "blocked_seconds",
            "deployed_at",
            "input_ended_at",
            "checkpoint_requested_at",
            "updated_at",
        ],
    )
    return deployments, events


#: How many PENDING jobs one pass looks at for the first that can fit (the rest wait).
SCAN_LIMIT = 100


def never_fits(slots_needed: int, capacity: int | None) -> str:
    """Why a job can never be scheduled on this cluster as it is ("" if it can)."""
    if capacity is None or slots_needed <= capacity:
        return ""
    return f"needs {slots_needed} slots, the cluster has {capacity}"


def unmatched(tags: dict[str, str] | None) -> str:
    """Why no worker can take a job with this ``tag_filter`` now ("" if one can): none that
    matches is alive, or every one is being drained."""
    if not tags or slot_transitions.takers(tags).exists():
        return ""
    wanted = f"tag_filter {describe_tags(tags)}"
    if slot_transitions.matching(Member.objects.alive(), tags).exists():
        return f"every live worker matching {wanted} is being drained"
    return f"no live worker matches {wanted}"


def placement_problem(slots_needed: int, tags: dict[str, str] | None) -> str:
    """Why a job can never be scheduled on the workers its ``tag_filter`` allows as the cluster
    is now ("" if it can): no such worker (``unmatched``), or too few slots between them.
    Without tags, ``never_fits`` on the whole cluster."""
    if not tags:
        return never_fits(slots_needed, slot_transitions.capacity())
    problem = unmatched(tags)
    if problem:
        return problem
    reason = never_fits(slots_needed, slot_transitions.capacity(tags))
    return f"{reason} among the workers matching tag_filter {describe_tags(tags)}" if reason else ""


def _note_pending(job: Job, reason: str) -> None:
    if job.pending_reason != reason:
        Job.objects.filter(id=job.id).update(pending_reason=reason)
        job.pending_reason = reason


def schedule_next(epoch: int) -> list[Deployment] | None:
    """Schedule the oldest PENDING job that can ever fit, if slots allow now. None: nothing
    scheduled.

    The rule (SeaTunnel's WAIT strategy, minus head-of-line blocking by the impossible): jobs
    wait in FIFO order for free slots, so a big job is not starved by small ones; but a job that
    needs more slots than every ALIVE member could give is passed over, with ``pendingReason``
    saying so, until the cluster grows. Every waiting job's ``pendingReason`` says why."""
    with fenced(epoch):
        capacity = slot_transitions.capacity()
        problems: dict[tuple, str] = {}  # a tag_filter's, by (slots needed, tags), once a pass
        head = None
        for job_id, needed, noted, env in (
            Job.objects.filter(status=JobStatus.PENDING)
            .order_by("id")
            .values_list("id", "slots_needed", "pending_reason", "env")[:SCAN_LIMIT]
        ):
            tags = (env or {}).get(TAG_FILTER)
            if tags:
                key = (needed, tuple(sorted(tags.items())))
                if key not in problems:
                    problems[key] = placement_problem(needed, tags)
                reason = problems[key]
            else:
                reason = never_fits(needed, capacity)
            if not reason:
                head = job_id
                break
            if reason != noted:
                Job.objects.filter(id=job_id, status=JobStatus.PENDING).update(
                    pending_reason=reason
                )
        if head is None:
            return None
        job = (
            Job.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(id=head, status=JobStatus.PENDING)
            .first()
        )
        if job is None:
            return None
        groups = list(
            TaskGroup.objects.filter(job=job)
            .select_related("pipeline")
            .order_by("pipeline__index", "kind", "index")
        )
        tags = job.env.get(TAG_FILTER)
        slots = slot_transitions.take(len(groups), tags)
        if slots is None:
            # Stays PENDING; FIFO: nothing behind it goes first.
            free = slot_transitions.free_count(tags)
            where = f" on workers matching tag_filter {describe_tags(tags)}" if tags else ""
            _note_pending(job, f"waiting for {len(groups)} free slots{where} ({free} free now)")
            return None
        deployments, group_events = deploy_on(groups, slots, epoch)
        Pipeline.objects.filter(job=job).update(status=ExecutionStatus.DEPLOYING)
        job.status = JobStatus.SCHEDULED
        job.pending_reason = ""
        job.save(update_fields=["status", "pending_reason"])
        events = [
            builders.pipeline_status(
                job.id, index, ExecutionStatus.CREATED, ExecutionStatus.DEPLOYING, epoch=epoch
            )
            for index in sorted({g.pipeline.index for g in groups})
        ]
        events += group_events
        events.append(
            builders.job_status(job.id, JobStatus.PENDING, JobStatus.SCHEDULED, epoch=epoch)
        )
        append_events(events)
    log.info("job %s scheduled on %s slots", job.id, len(slots))
    return deployments
