"""The job page's sections beyond its state: graph, checkpoints, exceptions, logs and events,
as job_context (dashboard.live) adds them to every render of the page, first load and live
alike. Each section is one bounded read (a limit, no query per row), since the page is rendered
again for every open tab whenever something happens to its job."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlencode

from django.utils import timezone

from dashboard import event_sentences, graph
from engine import queries
from engine.jobs import checkpoint_history, exceptions, tasklog_reading

CHECKPOINTS = 100
EXCEPTIONS = 16
LOG_LINES = 200
#: Events read for the list (triggered and completed checkpoints left out in the query): runs
#: of failed checkpoints collapse, so more are read than shown.
EVENTS_READ = 200
EVENT_LINES = 40


def group_names(pipelines: list[dict]) -> dict[int, str]:
    """{task group id: "reader 1 of pipeline 2"} from the job summary's pipelines."""
    return {
        g["taskGroupId"]: f"{str(g['kind']).lower()} {g['index']} of pipeline {p['pipelineId']}"
        for p in pipelines
        for g in p.get("taskGroups", [])
    }


def log_filters(query, names: dict[int, str]) -> dict[str, str]:
    """The logs' filters as they stand in the page's URL (``logLevel``, ``logTaskGroup``), an
    unknown level or a task group not of this job dropped."""
    level = str(query.get("logLevel", "")).upper()
    group = str(query.get("logTaskGroup", ""))
    return {
        "logLevel": level if level in tasklog_reading.LEVELS else "",
        "logTaskGroup": group if group.isdigit() and int(group) in names else "",
    }


def back_pressure(pipelines: list[dict]) -> None:
    """Give each Lane B reader its back-pressure as the page shows it (``backPressure``): the
    share of its busy time spent waiting on its sinks' writes, and Flink's level for it (OK up
    to 10 %, LOW up to 50 %, HIGH above). Lane A readers show their runtime's mailbox instead."""
    for pipeline in pipelines:
        if (pipeline.get("sourceRuntime") or {}).get("lane") == "A":
            continue
        for group in pipeline.get("taskGroups", []):
            metrics = group.get("metrics") or {}
            ratio = metrics.get("backPressureRatio")
            if group.get("kind") != "READER" or ratio is None:
                continue
            group["backPressure"] = {
                "ratio": ratio,
                "percent": round(ratio * 100),
                "level": "ok" if ratio <= 0.1 else "low" if ratio <= 0.5 else "high",
                "blockedSeconds": round(metrics.get("blockedSeconds") or 0.0, 1),
            }


def sections(job_id: int, snapshot: dict, query) -> dict:
    """What the page shows below the job's summary, for ``job_context``."""
    pipelines = snapshot["pipelines"]
    back_pressure(pipelines)
    names = group_names(pipelines)
    filters = log_filters(query, names)
    return {
        "graph": graph.layout(graph.plans_from_dag(snapshot.get("dag")), pipelines),
        "checkpoint_rows": checkpoint_rows(job_id, names),
        "exception_rows": exceptions.recent(job_id)[:EXCEPTIONS],
        "log_filters": filters,
        "log_levels": list(tasklog_reading.LEVELS),
        "log_groups": sorted(names.items()),
        "log_lines": logs(job_id, filters, names),
        "event_lines": event_sentences.lines(
            queries.job_events(job_id, EVENTS_READ, without=event_sentences.LEFT_OUT), names
        )[:EVENT_LINES],
        # The page's own query for its polling and its socket (the chosen filters kept).
        "live_query": urlencode({k: v for k, v in filters.items() if v}),
    }


def _shown(moment: datetime | None, zone, clock: str = "%H:%M:%S") -> dict[str, str]:
    """A time as the page shows it (in the site's zone) and as ``datetime=`` says it. Formatted
    here, not by the template's ``date`` filter: the page draws hundreds of them per render."""
    if moment is None:
        return {"iso": "", "clock": ""}
    local = moment.astimezone(zone)
    return {"iso": local.isoformat(), "clock": local.strftime(clock)}


def human_bytes(size: int) -> str:
    """``512\xa0bytes``, ``1.5\xa0KB``: as Django's ``filesizeformat`` writes them (1024 a
    unit), at a fraction of its cost for the hundreds of sizes of a render."""
    if size < 1024:
        return f"{size}\xa0byte{'' if size == 1 else 's'}"
    value = float(size)
    for unit in ("KB", "MB", "GB", "TB", "PB"):
        value /= 1024
        if value < 1024 or unit == "PB":
            break
    return f"{value:.1f}\xa0{unit}"


def checkpoint_rows(job_id: int, names: dict[int, str]) -> list[dict]:
    """The newest checkpoints, each task group's acknowledgement named and timed from the
    trigger, sizes in human units."""
    rows = checkpoint_history.recent(job_id, CHECKPOINTS)
    zone = timezone.get_current_timezone()
    for row in rows:
        row["triggered"] = _shown(row["triggeredAt"], zone)
        row["size"] = human_bytes(row["sizeBytes"])
        for task in row["tasks"]:
            task["name"] = names.get(task["taskGroupId"]) or f"task group {task['taskGroupId']}"
            task["acked"] = _shown(task["ackedAt"], zone, "%H:%M:%S.%f")
            task["size"] = human_bytes(task["sizeBytes"])
            task["afterMs"] = (
                int((task["ackedAt"] - row["triggeredAt"]).total_seconds() * 1000)
                if task.get("ackedAt") and row.get("triggeredAt")
                else None
            )
    return rows


def logs(job_id: int, filters: dict[str, str], names: dict[int, str]) -> list[dict]:
    """The newest log lines the filters let through, oldest first, each with its task group's
    name."""
    lines = tasklog_reading.recent(
        job_id,
        task_group_id=int(filters["logTaskGroup"]) if filters["logTaskGroup"] else None,
        min_level=tasklog_reading.LEVELS.get(filters["logLevel"]),
        limit=LOG_LINES,
    )
    zone = timezone.get_current_timezone()
    for line in lines:
        line["taskGroup"] = names.get(line["taskGroupId"]) or f"task group {line['taskGroupId']}"
        line["when"] = _shown(line["at"], zone, "%H:%M:%S.%f")
        line["levelClass"] = str(line["level"]).lower().replace(" ", "-")
    return lines
