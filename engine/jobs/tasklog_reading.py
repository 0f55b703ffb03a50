"""Reading the log lines task groups wrote on their workers (engine.member.tasklogs ships them
into TaskLogLine), for the API and the job page: any web process shows any worker's lines."""

from __future__ import annotations

import logging

from engine.models import TaskLogLine

#: The LISTEN/NOTIFY channel a worker's flush names the jobs it wrote lines for on (a comma
#: list); the web process's relay re-renders those jobs' pages.
LOGS_CHANNEL = "keel_logs"

#: Level names a reader may ask for, as ``logging`` numbers them.
LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}
#: A level is kept in a smallint column.
MAX_LEVEL = 32767


def parse_level(text: str) -> int:
    """A minimum level from a name (any case; WARN and FATAL too, as ``logging`` spells them)
    or a number; ValueError for anything else."""
    name = text.strip().upper()
    name = {"WARN": "WARNING", "FATAL": "CRITICAL"}.get(name, name)
    if name in LEVELS:
        return LEVELS[name]
    if name.isdigit() and int(name) <= MAX_LEVEL:
        return int(name)
    raise ValueError(f"{text!r} is not a level: a name ({', '.join(LEVELS)}) or a number")


def level_name(level: int) -> str:
    """The name of a level number (``Level 25`` for one ``logging`` does not name)."""
    return logging.getLevelName(level)


def jobs_notified(payloads) -> set[int]:
    """The job ids named by notifications on LOGS_CHANNEL (their comma-list payloads)."""
    jobs: set[int] = set()
    for payload in payloads:
        jobs.update(int(part) for part in payload.split(",") if part.strip().isdigit())
    return jobs


def recent(
    job_id: int,
    task_group_id: int | None = None,
    min_level: int | None = None,
    limit: int = 200,
    after: int | None = None,
) -> list[dict]:
    """The job's lines, oldest first: the newest ``limit`` of them, or with ``after`` (a line
    id) the first ``limit`` after it (a polling client pages forward). Each line is
    ``{lineId, at, taskGroupId, attempt, level (name), logger, message}``, ``at`` a datetime."""
    lines = TaskLogLine.objects.filter(job_id=job_id)
    if task_group_id is not None:
        lines = lines.filter(task_group_id=task_group_id)
    if min_level is not None:
        lines = lines.filter(level__gte=min_level)
    fields = ("id", "at", "task_group_id", "attempt", "level", "logger", "message")
    if after is not None:
        rows = list(lines.filter(id__gt=after).order_by("id").values_list(*fields)[:limit])
    else:
        rows = list(lines.order_by("-id").values_list(*fields)[:limit])[::-1]
    return [
        {
            "lineId": line_id,
            "at": at,
            "taskGroupId": task_group,
            "attempt": attempt,
            "level": level_name(level),
            "logger": logger,
            "message": message,
        }
        for line_id, at, task_group, attempt, level, logger, message in rows
    ]
