"""The job page's summary beyond its status and dirty-job label: how often it was restored and
when last, who submitted it, when it was created, started and finished, how old its newest
completed checkpoint is and which workers it runs on. An operator reads from these whether a
job that lost a worker came back, without reading its events. Built from the job summary the
page already has, plus one query for the times only its events keep."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from engine import queries
from engine.models import Job
from engine.states import EXECUTION_TERMINAL


def ago(moment: datetime | None, now: datetime | None = None) -> str:
    """``12 s ago``, ``5 min ago``, ``3 h ago``, ``2 days ago`` (empty without a time)."""
    if moment is None:
        return ""
    seconds = max(int(((now or timezone.now()) - moment).total_seconds()), 0)
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min ago"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} days ago"


def _when(text: str | None) -> datetime | None:
    """A time as the summary keeps it (ISO 8601, ``Z`` for UTC)."""
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def workers(pipelines: list[dict]) -> list[str]:
    """The names of the members its task groups that have not ended run on, sorted."""
    return sorted(
        {
            g["member"]["name"]
            for p in pipelines
            for g in p.get("taskGroups", [])
            if g.get("member") and g.get("status") not in EXECUTION_TERMINAL
        }
    )


def facts(job: Job, snapshot: dict, now: datetime | None = None) -> dict:
    """The summary's facts of ``job`` (its ``submitted_by`` read with it), from ``snapshot``
    (engine.jobs.summary's, live or as its history kept it)."""
    pipelines = snapshot["pipelines"]
    restores = sum(p.get("restoreCount") or 0 for p in pipelines)
    times = queries.job_times(job.id, restores=bool(restores))
    checkpoint = _when((snapshot.get("checkpoints") or {}).get("latestAt"))
    return {
        "restores": restores,
        "lastRestoreAt": times["lastRestoreAt"] if restores else None,
        "lastRestoreAgo": ago(times["lastRestoreAt"], now) if restores else "",
        "submittedBy": job.submitted_by.username if job.submitted_by_id else None,
        "createdAt": job.created_at,
        "startedAt": times["startedAt"],
        "finishedAt": job.finished_at,
        "lastCheckpointAt": checkpoint,
        "lastCheckpointAgo": ago(checkpoint, now),
        "workers": workers(pipelines),
    }
