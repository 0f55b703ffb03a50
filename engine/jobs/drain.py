"""Planned leaves: an operator drains a member, the active master moves its work away and then
ends it as LEFT, classified PLANNED_VERIFIED (docs/decisions/0013-operations.md).

The request is an intent row (MemberDrain) written through the authenticated API with who asked,
why, a request id and a short expiry; nothing on the member itself is trusted (its own SIGTERM
stays UNCLASSIFIED). From that commit on, the member is given no new task group
(engine.cluster.slots). The active master's step, each change in its own fenced transaction:
- **close**: a job's RUNNING Lane A readers of a checkpointing pipeline on the member are first
  asked to close gracefully (engine.jobs.graceful_close): the job's task groups there wait until
  each has committed a checkpoint holding where it stopped reading (or until
  ``engine.drain.graceful-close-timeout``, or shortly before the drain expires), so the move
  below reads nothing twice; readers of a pipeline whose enumerator is on the member are
  closed too, wherever they run, as moving the enumerator restores the whole pipeline;
- **move**: every live task group on the member, job by job, fails as lost with the member and
  ``planned``, after its job's PLANNED_VERIFIED incident is registered (engine.dirty); the
  normal restore path redeploys its pipeline elsewhere from the latest checkpoint as attempt + 1,
  without using up ``job.retry.times``. The worker is told to stop the old attempt (a cancel);
  whatever it still sends is fenced by attempt;
- **leave**: once the master sees no live task group and no assigned slot on the member (its
  slots locked, so a deployment racing the check is seen), the member ends LEFT and its
  sessions are ended, as a removed member's are; the drain ends LEFT;
- a drain whose member ended otherwise first ends ABORTED (its task groups fail as lost with
  it, which restores the readers it closed too); one not done by ``expires_at`` ends EXPIRED,
  and the member takes work again, once the readers it closed are moved (a closed reader never
  reads again by itself).
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from engine import dirty
from engine.cluster import membership
from engine.cluster import slots as slot_transitions
from engine.events import append_events
from engine.fencing import fenced
from engine.jobs import graceful_close, lifecycle
from engine.jobs.checkpoints import database_now
from engine.jobs.envoptions import TAG_FILTER, describe_tags
from engine.jobs.scheduler import Deployment
from engine.models import EngineEvent, Job, Member, MemberDrain, Slot, TaskGroup
from engine.states import (
    EXECUTION_LIVE,
    DrainState,
    ExecutionStatus,
    JobStatus,
    MemberState,
    SlotMode,
    SlotState,
)

log = logging.getLogger("keel.drain")

#: Task-group statuses a drain moves (the others are ending already).
MOVABLE = graceful_close.MOVABLE


class DrainRefused(Exception):
    """A drain request that cannot be taken; ``status`` is the HTTP status it answers."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


def drain_event(kind: str, drain: MemberDrain, member: Member, **extra) -> EngineEvent:
    return EngineEvent(
        kind=kind,
        member=member,
        payload={
            "uuid": str(member.uuid),
            "name": member.name,
            "requestId": str(drain.request_id),
            "requestedBy": drain.requested_by_name,
            "reason": drain.reason,
            **extra,
        },
    )


def request_drain(
    member_uuid: str | uuidlib.UUID, user, reason: str, force: bool = False
) -> tuple[MemberDrain, bool]:
    """Record an operator's drain of an ALIVE member; returns (drain, created). Asking again
    while it drains returns the drain under way (an automation's retry is harmless).

    Without ``force``, refused when the other members have too few free slots for the member's
    task groups: a drain must not stop jobs for want of room."""
    reason = (reason or "").strip()
    if not reason:
        raise DrainRefused("reason: say why the member is drained (it is audited)", 400)
    if len(reason) > 500:
        raise DrainRefused("reason: at most 500 characters", 400)
    with transaction.atomic():
        member = Member.objects.select_for_update(no_key=True).filter(uuid=member_uuid).first()
        if member is None:
            raise DrainRefused(f"no member {member_uuid}", 404)
        if member.state != MemberState.ALIVE:
            raise DrainRefused(
                f"member {member.name} ({member.uuid}) is {member.state}: only an ALIVE member "
                "can be drained"
            )
        under_way = MemberDrain.objects.filter(member=member, state=DrainState.DRAINING).first()
        if under_way is not None:
            return under_way, False
        envs = TaskGroup.objects.filter(member=member, status__in=EXECUTION_LIVE).values_list(
            "job__env", flat=True
        )
        running = len(envs)
        if running and not force:
            _check_room(member, [(env or {}).get(TAG_FILTER) or None for env in envs])
        drain = MemberDrain.objects.create(
            member=member,
            requested_by=user if getattr(user, "pk", None) else None,
            requested_by_name=user.get_username() if user is not None else "",
            reason=reason,
            expires_at=timezone.now() + timedelta(seconds=settings.ENGINE["drain.timeout"]),
        )
        drain.refresh_from_db()
        append_events(
            [
                drain_event(
                    "member.drain-requested",
                    drain,
                    member,
                    expiresAt=drain.expires_at.isoformat(),
                    taskGroups=running,
                )
            ]
        )
    log.warning(
        "member %s (%s) drain requested by %s: %s",
        member.name,
        member.uuid,
        drain.requested_by_name,
        reason,
    )
    return drain, True


def _check_room(member: Member, filters: list[dict | None]) -> None:
    """Refuse the drain when the other members lack the free slots its task groups need: in
    all, and for each ``tag_filter`` among them, on the members it allows."""
    wanted: dict[str, tuple[dict | None, int]] = {"": (None, len(filters))}
    for tags in filters:
        if tags:
            key = describe_tags(tags)
            wanted[key] = (tags, wanted.get(key, (tags, 0))[1] + 1)
    for key, (tags, count) in wanted.items():
        room = _room_elsewhere(member, tags)
        if room is not None and room < count:
            where = f"the other members matching tag_filter {key}" if key else "the other members"
            raise DrainRefused(
                f"member {member.name} runs {count} task group(s) and {where} have {room} free "
                "slot(s): its jobs would wait for room; free slots first or drain with force"
            )


def _room_elsewhere(member: Member, tags: dict | None = None) -> int | None:
    """Free slots of the other members that take work (as ``tags`` asks; None: a dynamic
    member without limit)."""
    others = slot_transitions.takers(tags).exclude(id=member.id)
    dynamic = 0
    for member_id, mode, count in others.values_list("id", "slot_mode", "slot_count"):
        if mode == SlotMode.DYNAMIC:
            if count <= 0:
                return None
            used = Slot.objects.filter(member_id=member_id, state=SlotState.ASSIGNED).count()
            dynamic += max(count - used, 0)
    fixed = Slot.objects.filter(
        member__in=others.filter(slot_mode=SlotMode.FIXED), state=SlotState.FREE
    ).count()
    return fixed + dynamic


# -- the active master's step ----------------------------------------------------------------


def step(
    epoch: int, close: Callable[[Deployment], None] = lambda target: None
) -> tuple[bool, list[Deployment]]:
    """Advance every drain under way, oldest first: returns (did work, the old attempts to
    tell their worker to stop). ``close``: sends a reader attempt the graceful close."""
    did, stop, unanswered = False, [], []
    for drain in MemberDrain.objects.filter(state=DrainState.DRAINING).select_related("member"):
        member = drain.member
        if member.state != MemberState.ALIVE:
            why = f"member ended first: {member.state} ({member.end_reason})"
            did = _end(epoch, drain, DrainState.ABORTED, why) or did
            continue
        if drain.expires_at <= timezone.now():
            restored = _restore_closed(epoch, drain)  # first: a new master would do it again
            stop += restored
            why = "not done within engine.drain.timeout; the member takes work again"
            did = _end(epoch, drain, DrainState.EXPIRED, why) or bool(restored) or did
            continue
        moved = _move_off(epoch, drain, unanswered)
        stop += moved
        did = did or bool(moved)
        if not moved:
            did = _leave_if_empty(epoch, drain) or did
    for target in graceful_close.resends.due(unanswered):
        close(target)
    return did, stop


def _move_off(epoch: int, drain: MemberDrain, unanswered: list[Deployment]) -> list[Deployment]:
    """Fail the member's live task groups as planned moves, one job per transaction (job row
    first: the lock order of every task-group change), once its Lane A readers there closed
    gracefully (those not answering the close yet are added to ``unanswered``)."""
    member = drain.member
    now = database_now()
    jobs = sorted(
        set(
            TaskGroup.objects.filter(member=member, status__in=EXECUTION_LIVE).values_list(
                "job_id", flat=True
            )
        )
    )
    moved: list[Deployment] = []
    for job_id in jobs:
        with fenced(epoch):
            job = Job.objects.select_for_update(no_key=True).get(id=job_id)
            if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
                continue  # stopping: its task groups end by cancel, the member empties anyway
            # DEPLOYING and RUNNING ones; one already stopping (its pipeline is restoring after
            # another loss) ends by its cancel, and the member empties all the same.
            groups = list(
                TaskGroup.objects.filter(job=job, member=member, status__in=MOVABLE).values_list(
                    *Deployment.FIELDS
                )
            )
            if not groups:
                continue
            closing = graceful_close.plan(job, drain, now)
            if closing.waiting:
                unanswered += closing.unanswered
                continue  # its task groups move together once its readers closed
            moved += _fail_planned(epoch, job, drain, groups, closing.why)
    if moved:
        log.warning(
            "drain of %s: moved %s task group(s) of %s job(s)", member.name, len(moved), len(jobs)
        )
    return moved


def _fail_planned(
    epoch: int, job: Job, drain: MemberDrain, groups: list[tuple], why: Callable[[int], str]
) -> list[Deployment]:
    """Fail the job's task groups ``groups`` (Deployment rows) on the drained member as planned
    moves, in the caller's fenced transaction with the job row locked; ``why``: what the reason
    adds for a task group. The attempts moved."""
    member = drain.member
    # The incident first (the job's state row after its job row), so the restore this starts
    # binds to a PLANNED_VERIFIED episode.
    append_events(dirty.on_planned_move(job, member, epoch))
    reason = (
        f"moved off member {member.name} ({member.uuid}): drained by "
        f"{drain.requested_by_name} ({drain.reason})"
    )
    moved = []
    for row in groups:
        target = Deployment.of(row)
        if lifecycle.finish_task_group(
            target.task_group_id,
            target.attempt,
            None,
            ExecutionStatus.FAILED,
            reason + why(target.task_group_id),
            lost_member_id=member.id,
            planned=True,
        ):
            moved.append(target)
    MemberDrain.objects.filter(id=drain.id).update(
        moved_task_groups=drain.moved_task_groups + len(moved)
    )
    drain.moved_task_groups += len(moved)
    return moved


def _restore_closed(epoch: int, drain: MemberDrain) -> list[Deployment]:
    """The drain expires: move the task groups that make every reader it closed restore
    (``graceful_close.stranded``), one job per transaction; the attempts moved."""
    moved: list[Deployment] = []
    for job_id, ids in sorted(graceful_close.stranded(drain).items()):
        with fenced(epoch):
            job = Job.objects.select_for_update(no_key=True).get(id=job_id)
            if job.status not in (JobStatus.SCHEDULED, JobStatus.RUNNING):
                continue  # stopping: its task groups end by cancel
            groups = list(
                TaskGroup.objects.filter(
                    id__in=ids, member=drain.member, status__in=MOVABLE
                ).values_list(*Deployment.FIELDS)
            )
            if groups:
                moved += _fail_planned(epoch, job, drain, groups, _expired_why)
    if moved:
        log.warning(
            "drain of %s expired: moved %s task group(s) whose readers had closed gracefully",
            drain.member.name,
            len(moved),
        )
    return moved


def _expired_why(task_group_id: int) -> str:
    return "; a reader had closed gracefully and the drain expired"


def _leave_if_empty(epoch: int, drain: MemberDrain) -> bool:
    """The member holds nothing: it leaves as LEFT (PLANNED_VERIFIED) and the drain ends."""
    member = drain.member
    with fenced(epoch):
        # Its slots locked (the scheduler takes slots SKIP LOCKED and never waits on these):
        # a deployment that took one before the drain committed is seen here, not missed.
        with connection.cursor() as cur:
            cur.execute(
                "SELECT id FROM engine_slot WHERE member_id = %s ORDER BY id FOR NO KEY UPDATE",
                [member.id],
            )
        busy = (
            Slot.objects.filter(member=member, state=SlotState.ASSIGNED).exists()
            or TaskGroup.objects.filter(member=member, status__in=EXECUTION_LIVE).exists()
        )
        alive = (
            Member.objects.select_for_update(no_key=True)
            .filter(id=member.id, state=MemberState.ALIVE)
            .exists()
        )
        if busy or not alive:
            return False  # not empty yet; or it ended otherwise: the next pass aborts the drain
        if not MemberDrain.objects.filter(id=drain.id, state=DrainState.DRAINING).update(
            state=DrainState.LEFT, ended_at=Now(), end_reason="verified empty; member LEFT"
        ):
            return False
        reason = f"drained by {drain.requested_by_name}: {drain.reason}"
        ended = membership.leave_drained(epoch, member.id, reason[:200])
        append_events(
            [
                drain_event(
                    "member.drained",
                    drain,
                    member,
                    state=DrainState.LEFT,
                    movedTaskGroups=drain.moved_task_groups,
                )
            ]
        )
    membership.end_member_sessions(ended)
    log.warning("member %s (%s) drained and LEFT", member.name, member.uuid)
    return True


def _end(epoch: int, drain: MemberDrain, state: str, why: str) -> bool:
    with fenced(epoch):
        if not MemberDrain.objects.filter(id=drain.id, state=DrainState.DRAINING).update(
            state=state, ended_at=Now(), end_reason=why
        ):
            return False
        append_events(
            [
                drain_event(
                    "member.drained",
                    drain,
                    drain.member,
                    state=state,
                    endReason=why,
                    movedTaskGroups=drain.moved_task_groups,
                )
            ]
        )
    log.warning("drain of member %s ended %s: %s", drain.member.name, state, why)
    return True
