"""Scheduling by the active master: PENDING jobs get slots in FIFO order, under row locks.

The head of the queue (oldest PENDING job) is scheduled when enough slots are free; until then
every later job waits too (FIFO: a big job is not starved by small ones). Slots of ALIVE members
are taken with ``FOR NO KEY UPDATE SKIP LOCKED``, spread across members by sequence; dynamic-slot
members get new slot rows on demand. Deploy commands go out only after the commit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import connection
from django.db.models import Count, Max
from django.db.models.functions import Now

from engine.events import append_events
from engine.fencing import fenced
from engine.models import EngineEvent, Job, Member, Pipeline, Slot, TaskGroup
from engine.states import ExecutionStatus, JobStatus, MemberState, SlotMode, SlotState

log = logging.getLogger("keel.scheduler")


@dataclass(frozen=True)
class Deployment:
    """A task group attempt placed on a member: where its commands go."""

    task_group_id: int
    attempt: int
    member_name: str
    member_uuid: str

    #: The task-group values a Deployment is read from (``values_list(*Deployment.FIELDS)``).
    FIELDS = ("id", "attempt", "member__name", "member__uuid")

    @classmethod
    def of(cls, row: tuple) -> Deployment:
        group_id, attempt, member_name, member_uuid = row[:4]
        return cls(group_id, attempt, member_name, str(member_uuid))


def _free_slots(count: int) -> list[tuple[int, int]]:
    """Lock up to ``count`` free slots of ALIVE members: [(slot id, member id)]."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT s.id, s.member_id
              FROM engine_slot s JOIN engine_member m ON m.id = s.member_id
             WHERE m.state = %s AND s.state = %s
             ORDER BY s.sequence, s.member_id
             LIMIT %s
               FOR NO KEY UPDATE OF s SKIP LOCKED
            """,
            [MemberState.ALIVE, SlotState.FREE, count],
        )
        return [(row[0], row[1]) for row in cur.fetchall()]


def _dynamic_slots(count: int) -> list[tuple[int, int]]:
    """Create up to ``count`` new slots on dynamic-slot members, round-robin.

    A dynamic member with ``slot_count`` > 0 never holds more than that many assigned slots;
    0 means unbounded. Members are locked (in id order) so concurrent calls cannot overshoot.
    """
    members = list(
        Member.objects.select_for_update(no_key=True)
        .filter(state=MemberState.ALIVE, slot_mode=SlotMode.DYNAMIC)
        .order_by("id")
    )
    if not members or count <= 0:
        return []
    top = dict(
        Slot.objects.filter(member__in=members)
        .values("member_id")
        .annotate(top=Max("sequence"))
        .values_list("member_id", "top")
    )
    used = dict(
        Slot.objects.filter(member__in=members, state=SlotState.ASSIGNED)
        .values("member_id")
        .annotate(n=Count("id"))
        .values_list("member_id", "n")
    )
    room = {
        m.id: (m.slot_count - used.get(m.id, 0)) if m.slot_count > 0 else count for m in members
    }
    created: list[Slot] = []
    while len(created) < count and any(r > 0 for r in room.values()):
        for member in members:
            if len(created) == count:
                break
            if room[member.id] <= 0:
                continue
            room[member.id] -= 1
            top[member.id] = top.get(member.id, 0) + 1
            created.append(Slot(member=member, sequence=top[member.id], state=SlotState.FREE))
    Slot.objects.bulk_create(created)
    return [(slot.id, slot.member_id) for slot in created]


def take_slots(count: int) -> list[tuple[int, int]] | None:
    """Lock ``count`` free slots (creating dynamic ones if needed), or None if there are not
    enough: then nothing is taken (the locks go with the caller's transaction)."""
    slots = _free_slots(count)
    if len(slots) < count:
        slots += _dynamic_slots(count - len(slots))
    return slots if len(slots) == count else None


def deploy_on(
    groups: list[TaskGroup], slots: list[tuple[int, int]], epoch: int
) -> tuple[list[Deployment], list[EngineEvent]]:
    """Give each task group a slot and a new attempt, DEPLOYING, in one statement per table.

    Returns the deploy commands to send once the caller's transaction commits, and the
    ``taskgroup.status`` events for the caller to append with its own.
    """
    members = {
        pk: (name, uuid)
        for pk, name, uuid in Member.objects.filter(id__in={m for _, m in slots}).values_list(
            "id", "name", "uuid"
        )
    }
    Slot.objects.filter(id__in=[s for s, _ in slots]).update(state=SlotState.ASSIGNED)
    deployments = []
    for group, (slot_id, member_id) in zip(groups, slots, strict=True):
        group.slot_id, group.member_id = slot_id, member_id
        group.status = ExecutionStatus.DEPLOYING
        group.attempt += 1
        group.error_msg = ""
        group.lost_member_id = None
        group.source_received = group.sink_written = 0
        group.rows_per_second = 0.0
        group.deployed_at = group.updated_at = Now()
        name, member_uuid = members[member_id]
        deployments.append(Deployment(group.id, group.attempt, name, str(member_uuid)))
    TaskGroup.objects.bulk_update(
        groups,
        [
            "slot",
            "member",
            "status",
            "attempt",
            "error_msg",
            "lost_member",
            "source_received",
            "sink_written",
            "rows_per_second",
            "deployed_at",
            "updated_at",
        ],
    )
    events = [
        EngineEvent(
            kind="taskgroup.status",
            job_id=g.job_id,
            member_id=g.member_id,
            epoch=epoch,
            payload={
                "taskGroupId": g.id,
                "attempt": g.attempt,
                "to": ExecutionStatus.DEPLOYING,
                "slotId": g.slot_id,
            },
        )
        for g in groups
    ]
    return deployments, events


def schedule_next(epoch: int) -> list[Deployment] | None:
    """Schedule the oldest PENDING job if slots allow. None: nothing scheduled."""
    with fenced(epoch):
        job = (
            Job.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(status=JobStatus.PENDING)
            .order_by("id")
            .first()
        )
        if job is None:
            return None
        groups = list(
            TaskGroup.objects.filter(job=job)
            .select_related("pipeline")
            .order_by("pipeline__index", "kind", "index")
        )
        slots = take_slots(len(groups))
        if slots is None:
            return None  # stays PENDING; FIFO: nothing behind it goes first
        deployments, group_events = deploy_on(groups, slots, epoch)
        Pipeline.objects.filter(job=job).update(status=ExecutionStatus.DEPLOYING)
        job.status = JobStatus.SCHEDULED
        job.save(update_fields=["status"])
        events = [
            EngineEvent(
                kind="pipeline.status",
                job_id=job.id,
                epoch=epoch,
                payload={
                    "pipelineId": index,
                    "from": ExecutionStatus.CREATED,
                    "to": ExecutionStatus.DEPLOYING,
                },
            )
            for index in sorted({g.pipeline.index for g in groups})
        ]
        events += group_events
        events.append(
            EngineEvent(
                kind="job.status",
                job_id=job.id,
                epoch=epoch,
                payload={"from": JobStatus.PENDING, "to": JobStatus.SCHEDULED},
            )
        )
        append_events(events)
    log.info("job %s scheduled on %s slots", job.id, len(slots))
    return deployments
