"""Appending to the event store.

Events are appended in the transaction of the state change they describe (transactional outbox).
A plain ``bigserial`` is not enough for readers that page with ``after=seq``: two transactions can
draw seq 10 and 11 and commit 11 first, and a reader that saw 11 would skip 10 for ever. So every
append first takes one transaction-scoped advisory lock: seq values are drawn and committed in
order. The lock is held only from the append to the commit, and appends are the last statement of
their transaction (deferred foreign-key checks are run just before), so it cannot take part in a
deadlock (docs/decisions/0002-event-order.md). Row locks are taken ``FOR NO KEY UPDATE``
everywhere, so they never block another transaction's foreign-key checks.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from engine.locks import EVENT_APPEND
from engine.models import EngineEvent, Job, Member
from engine.states import MemberState

#: The PostgreSQL LISTEN/NOTIFY channel an appending transaction notifies.
EVENTS_CHANNEL = "keel_events"

#: What every append runs first, in one round trip (every state change of the engine appends
#: its events). Foreign keys are checked at commit by default: check them now, so the commit
#: never waits for a row lock while this transaction holds the append lock. The notification
#: wakes the web process's relay (dashboard push) when this transaction commits; one payload, so
#: a transaction's notifications collapse into one.
APPEND_PRELUDE = (
    "SET CONSTRAINTS ALL IMMEDIATE",
    "SELECT pg_advisory_xact_lock(%(append_class)s::int, %(append_object)s::int),"
    " pg_notify(%(append_channel)s::text, '')",
)
APPEND_PRELUDE_PARAMS = {
    "append_class": EVENT_APPEND[0],
    "append_object": EVENT_APPEND[1],
    "append_channel": EVENTS_CHANNEL,
}


def append_events(events: Iterable[EngineEvent]) -> list[EngineEvent]:
    """Append events inside the caller's transaction; must be its last write."""
    events = list(events)
    if not events:
        return events
    if not connection.in_atomic_block:
        raise RuntimeError("append_events must run inside the state change's transaction")
    with connection.cursor() as cur:
        cur.execute("; ".join(APPEND_PRELUDE), APPEND_PRELUDE_PARAMS)
    return EngineEvent.objects.bulk_create(events)


def append_event(event: EngineEvent) -> EngineEvent:
    """Append one event; see append_events."""
    return append_events([event])[0]


# One builder per event kind: the catalogue of what the event store records, and the one place a
# kind's payload is shaped. Payload keys are camelCase (the REST contract); ``pipelineId`` is the
# pipeline's 1-based index within its job, as everywhere in the API.


def job_submitted(job: Job, pipelines: int) -> EngineEvent:
    return EngineEvent(
        kind="job.submitted",
        job_id=job.id,
        payload={
            "jobName": job.name,
            "jobStatus": job.status,
            "mode": job.mode,
            "pipelines": pipelines,
            "slotsNeeded": job.slots_needed,
        },
    )


def job_status(
    job_id: int, previous: str, to: str, *, epoch: int | None = None, error_msg: str | None = None
) -> EngineEvent:
    payload = {"from": previous, "to": to}
    if error_msg is not None:
        payload["errorMsg"] = error_msg
    return EngineEvent(kind="job.status", job_id=job_id, epoch=epoch, payload=payload)


def pipeline_status(
    job_id: int, pipeline_index: int, previous: str, to: str, *, epoch: int | None = None
) -> EngineEvent:
    payload = {"pipelineId": pipeline_index, "from": previous, "to": to}
    return EngineEvent(kind="pipeline.status", job_id=job_id, epoch=epoch, payload=payload)


def taskgroup_status(
    job_id: int,
    task_group_id: int,
    attempt: int,
    previous: str,
    to: str,
    *,
    member_id: int | None = None,
    epoch: int | None = None,
    error: str = "",
    slot_id: int | None = None,
) -> EngineEvent:
    payload = {"taskGroupId": task_group_id, "attempt": attempt, "from": previous, "to": to}
    if slot_id is not None:
        payload["slotId"] = slot_id
    if error:
        payload["error"] = error[:500]
    return EngineEvent(
        kind="taskgroup.status", job_id=job_id, member_id=member_id, epoch=epoch, payload=payload
    )


def pipeline_restore_requested(
    job_id: int,
    pipeline_index: int,
    restore: int,
    in_seconds: float,
    task_groups: list[int] | None = None,
) -> EngineEvent:
    """``task_groups``: a reader restore's readers (the rest of the pipeline runs on)."""
    payload = {"pipelineId": pipeline_index, "restore": restore, "inSeconds": in_seconds}
    if task_groups is not None:
        payload["taskGroups"] = task_groups
    return EngineEvent(kind="pipeline.restore-requested", job_id=job_id, payload=payload)


def pipeline_restore_withdrawn(
    job_id: int, pipeline_index: int, restore: int, task_groups: list[int], reason: str
) -> EngineEvent:
    """A reader restore not run yet gives way to the whole pipeline's (or to its end)."""
    payload = {
        "pipelineId": pipeline_index,
        "restore": restore,
        "taskGroups": task_groups,
        "reason": reason,
    }
    return EngineEvent(kind="pipeline.restore-withdrawn", job_id=job_id, payload=payload)


def pipeline_restore(
    job_id: int,
    epoch: int,
    pipeline_index: int,
    restore: int,
    *,
    cause: str,
    slots: list[int],
    from_checkpoint: int | None,
    task_groups: list[int] | None = None,
) -> EngineEvent:
    payload = {
        "pipelineId": pipeline_index,
        "restore": restore,
        "cause": cause,
        "slots": slots,
        "fromCheckpoint": from_checkpoint,
    }
    if task_groups is not None:
        payload["taskGroups"] = task_groups
    return EngineEvent(kind="pipeline.restore", job_id=job_id, epoch=epoch, payload=payload)


def checkpoint_triggered(
    job_id: int, epoch: int, checkpoint_id: int, pipeline_index: int
) -> EngineEvent:
    payload = {"checkpointId": checkpoint_id, "pipelineId": pipeline_index}
    return EngineEvent(kind="checkpoint.triggered", job_id=job_id, epoch=epoch, payload=payload)


def checkpoint_ended(
    job_id: int, epoch: int, checkpoint_id: int, pipeline_index: int, state: str, reason: str = ""
) -> EngineEvent:
    """``checkpoint.completed`` or ``checkpoint.failed`` (with its reason)."""
    payload = {"checkpointId": checkpoint_id, "pipelineId": pipeline_index}
    if reason:
        payload["reason"] = reason
    return EngineEvent(
        kind=f"checkpoint.{state.lower()}", job_id=job_id, epoch=epoch, payload=payload
    )


def member_joined(member: Member) -> EngineEvent:
    return EngineEvent(
        kind="member.joined",
        member=member,
        payload={
            "uuid": str(member.uuid),
            "name": member.name,
            "address": member.address,
            "slotMode": member.slot_mode,
            "slots": member.slot_count,
            "protocolVersion": member.protocol_version,
            "tags": member.tags,
        },
    )


def member_ended(
    member: Member, reason: str, sequence: int, epoch: int | None, classification: str = ""
) -> EngineEvent:
    """``member.left`` (it said so itself) or ``member.removed`` (by the active master), by the
    member's new state; ``sequence`` is the member-event sequence the end was counted as."""
    kind = "member.left" if member.state == MemberState.LEFT else "member.removed"
    return EngineEvent(
        kind=kind,
        member=member,
        epoch=epoch,
        payload={
            "uuid": str(member.uuid),
            "name": member.name,
            "address": member.address,
            "reason": reason,
            "memberEventSequence": sequence,
            "classification": classification,
        },
    )


def master_elected(epoch: int, master: str, pid: int, host: str) -> EngineEvent:
    return EngineEvent(
        kind="master.elected", epoch=epoch, payload={"master": master, "pid": pid, "host": host}
    )


def master_resigned(epoch: int, master: str) -> EngineEvent:
    return EngineEvent(kind="master.resigned", epoch=epoch, payload={"master": master})


def job_history_failed(job_id: int, epoch: int | None, error: str) -> EngineEvent:
    """The finished-job record could not be written at the job's end (it is retried)."""
    return EngineEvent(
        kind="job.history-failed", job_id=job_id, epoch=epoch, payload={"error": error[:500]}
    )
