"""Read models for the API and the dashboard (no writes here)."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection
from django.db.models import (
    BigIntegerField,
    Count,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Coalesce

from engine import counters, dirty
from engine.jobs import summary as job_summary
from engine.models import EngineEvent, Job, Member, MemberDrain, Slot, TaskGroup
from engine.models.events import CHECKPOINT_PROGRESS_KINDS
from engine.states import JobStatus, MemberState, SlotState

MAX_EVENT_PAGE = 500


def members() -> QuerySet[Member]:
    """Members, newest first, with their slot counts and drains (newest first)."""
    return (
        Member.objects.annotate(
            slot_total=Count("slots"),
            slot_assigned=Count("slots", filter=Q(slots__state=SlotState.ASSIGNED)),
        )
        .prefetch_related(
            Prefetch(
                "drains", queryset=MemberDrain.objects.select_related("member").order_by("-id")
            )
        )
        .order_by("-started_at", "-id")
    )


def overview() -> dict:
    """The cluster at a glance, read in one round trip (a consistent snapshot)."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT l.holder, l.epoch, l.since, l.expires_at, l.expires_at > now(),
                   c.member_event_sequence,
                   (SELECT count(*) FROM engine_member WHERE state = %(alive)s),
                   (SELECT count(*) FROM engine_member WHERE state = %(removed)s),
                   (SELECT count(*) FROM engine_member WHERE state = %(left)s),
                   (SELECT count(*) FROM engine_slot s JOIN engine_member m ON m.id = s.member_id
                     WHERE m.state = %(alive)s),
                   (SELECT count(*) FROM engine_slot s JOIN engine_member m ON m.id = s.member_id
                     WHERE m.state = %(alive)s AND s.state = %(assigned)s)
              FROM engine_masterlease l CROSS JOIN engine_clusterstate c
             WHERE l.id = 1 AND c.id = 1
            """,
            {
                "alive": MemberState.ALIVE,
                "removed": MemberState.REMOVED,
                "left": MemberState.LEFT,
                "assigned": SlotState.ASSIGNED,
            },
        )
        row = cur.fetchone()
    (holder, epoch, since, expires_at, valid, sequence, alive, removed, left, total, assigned) = row
    active = (
        {"name": holder, "epoch": epoch, "since": since, "leaseExpiresAt": expires_at}
        if holder and valid
        else None
    )
    jobs = dict(
        Job.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n")
    )
    return {
        "activeMaster": active,
        "epoch": epoch,
        "members": {"alive": alive, "removed": removed, "left": left},
        "totalSlot": total,
        "assignedSlot": assigned,
        "unassignedSlot": total - assigned,
        "memberEventSequence": sequence,
        "runningJobs": jobs.get(JobStatus.RUNNING, 0) + jobs.get(JobStatus.SCHEDULED, 0),
        "pendingJobs": jobs.get(JobStatus.PENDING, 0) + jobs.get(JobStatus.CREATED, 0),
        "finishedJobs": jobs.get(JobStatus.FINISHED, 0),
        "failedJobs": jobs.get(JobStatus.FAILED, 0),
        "canceledJobs": jobs.get(JobStatus.CANCELED, 0),
    }


def tagged_workers(tags: dict[str, str]) -> dict:
    """ALIVE members whose tags hold every pair of ``tags``: how many, and their slots (total and
    unassigned), as SeaTunnel's ``/overview?tag=value`` counts them."""
    members = Member.objects.alive().filter(tags__contains=tags)
    slots = Slot.objects.filter(member__in=members)
    total = slots.count()
    assigned = slots.filter(state=SlotState.ASSIGNED).count()
    return {"works": members.count(), "totalSlot": total, "unassignedSlot": total - assigned}


def slots() -> list[dict]:
    """Every slot of every ALIVE member, with its owner (the task group holding it)."""
    owners = {
        g["slot_id"]: g
        for g in TaskGroup.objects.live()
        .filter(slot__isnull=False)
        .values("slot_id", "id", "job_id", "pipeline__index")
    }
    out = []
    for slot in (
        Slot.objects.filter(member__in=Member.objects.alive())
        .select_related("member")
        .order_by("member__name", "sequence")
    ):
        owner = owners.get(slot.id)
        out.append(
            {
                "id": slot.id,
                "sequence": slot.sequence,
                "state": slot.state,
                "member": {"uuid": slot.member.uuid, "name": slot.member.name},
                "owner": (
                    {
                        "jobId": owner["job_id"],
                        "pipelineId": owner["pipeline__index"],
                        "taskGroupId": owner["id"],
                    }
                    if owner
                    else None
                ),
            }
        )
    return out


def _rows(history_key: str, task_group_field: str, retired: str) -> Coalesce:
    """A row count as the job's detail reads it: a finished job's from its history (its task
    groups are gone once its running state is cleaned up), a running job's summed live plus
    the rows of the attempts its restores replaced (``retired``, a counters.PER_JOB total)."""
    kept = KeyTextTransform(history_key, KeyTransform("metrics", "history__summary"))
    return Coalesce(
        Cast(kept, BigIntegerField()),
        Sum(f"task_groups__{task_group_field}")
        + Cast(job_summary.retired(retired), BigIntegerField()),
        output_field=BigIntegerField(),
    )


def jobs_with_rows() -> QuerySet[Job]:
    """Jobs with their row counts and dirty-job label, newest first (the dashboard's recent
    jobs, which it filters as the API does before it takes the first few)."""
    return dirty.annotate(
        Job.objects.annotate(
            rows_read=_rows(
                "sourceReceivedCount", "source_received", counters.JOB_ROWS_READ_RETIRED
            ),
            rows_written=_rows("sinkWriteCount", "sink_written", counters.JOB_ROWS_WRITTEN_RETIRED),
        )
    ).order_by("-id")


def recent_events(limit: int = 20) -> list[EngineEvent]:
    """The newest events of the cluster, newest first."""
    return list(EngineEvent.objects.select_related("member").order_by("-seq")[:limit])


def job_events(job_id: int, limit: int = 30, without: Sequence[str] = ()) -> list[EngineEvent]:
    """A job's newest events, newest first, with their member; ``without``: kinds left out
    in the query (the job page leaves out the checkpoints it lists in their own section, so
    they do not push its failures and restores out of the newest few)."""
    events = EngineEvent.objects.filter(job_id=job_id)
    if without:
        events = events.exclude(kind__in=without)
    return list(events.select_related("member").order_by("-seq")[:limit])


def job_times(job_id: int, restores: bool = True) -> dict:
    """When the job first went RUNNING (``startedAt``) and when a pipeline of it was last
    restored (``lastRestoreAt``; read only if it was), from its events: one query of two
    ordered reads of one row each on the job's story index (None for an event retention
    removed, or that never happened)."""
    story = EngineEvent.objects.filter(job_id=job_id).exclude(kind__in=CHECKPOINT_PROGRESS_KINDS)
    started = story.filter(kind="job.status", payload__to=JobStatus.RUNNING).order_by("seq")
    restored = story.filter(kind="pipeline.restore").order_by("-seq")
    times = {"startedAt": Subquery(started.values("at")[:1])}
    if restores:
        times["lastRestoreAt"] = Subquery(restored.values("at")[:1])
    row = Job.objects.filter(id=job_id).values(**times).first() or {}
    return {"startedAt": row.get("startedAt"), "lastRestoreAt": row.get("lastRestoreAt")}


def latest_seq() -> int:
    """The newest event's seq (0 if none)."""
    return EngineEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0


def events_after(after: int, limit: int = MAX_EVENT_PAGE) -> list[EngineEvent]:
    limit = max(1, min(limit, MAX_EVENT_PAGE))
    return list(
        EngineEvent.objects.select_related("member").filter(seq__gt=after).order_by("seq")[:limit]
    )


MEMBER_STATES = [s.value for s in MemberState]
