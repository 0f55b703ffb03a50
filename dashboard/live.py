"""What the live pages show, rendered the same way for the first page load, for htmx's polling
fallback and for the socket's out-of-band swaps (dashboard.consumers)."""

from __future__ import annotations

import re
from urllib.parse import urlencode

from django.db.models import Count, Q, Sum
from django.template.loader import render_to_string

from dashboard import job_facts, job_sections
from dashboard.filters import accepted, filtered, page_of
from engine import dirty, queries
from engine.api.filters import MAX_SEARCH, JobFilter
from engine.jobs import summary as job_summary
from engine.jobs import throughput
from engine.models import Job, JobCleanupRecord
from engine.roles import CANCEL_JOB, DRAIN_MEMBER
from engine.states import JOB_TERMINAL, CleanupKind, DirtyEvaluation, JobStatus

_JOB_TOPIC = re.compile(r"^job\.(\d{1,18})$")


def topic(text: str) -> str | None:
    """``jobs``, ``cluster`` or ``job.N``; None for anything else."""
    if text in ("jobs", "cluster") or _JOB_TOPIC.match(text):
        return text
    return None


# -- the jobs page -------------------------------------------------------------------------------


def job_filters(query) -> dict[str, str]:
    """The filters of the jobs page, as they stand in its URL: as the API's ``JobFilter``
    takes them, those it refuses dropped (the search cut to its longest, as typed)."""
    typed = {
        "jobStatus": query.get("jobStatus", ""),
        "evaluationStatus": query.get("evaluationStatus", ""),
        "q": str(query.get("q", "")).strip()[:MAX_SEARCH],
    }
    page = str(query.get("page", "1"))
    return {**accepted(JobFilter, typed, typed.keys()), "page": page if page.isdigit() else "1"}


def jobs_context(query) -> dict:
    filters = job_filters(query)
    # The health counts are of the jobs the other filters leave, whatever their health.
    others = {**filters, "evaluationStatus": ""}
    base = filtered(JobFilter, others, dirty.annotate(Job.objects.all()))
    counts = dict.fromkeys(DirtyEvaluation.values, 0)
    for row in base.order_by().values("dirty_evaluation").annotate(n=Count("id")):
        counts[row["dirty_evaluation"]] = row["n"]
    jobs = filtered(
        JobFilter,
        filters,
        dirty.annotate(
            Job.objects.annotate(
                rows_per_second=Sum(
                    "task_groups__rows_per_second", filter=Q(task_groups__status="RUNNING")
                )
            )
        ),
    )
    page = page_of(jobs.order_by("-id"), filters["page"])
    return {
        "filters": filters,
        "jobs": page.object_list,
        "page": page,
        "counts": counts,
        "statuses": JobStatus.values,
        "evaluations": DirtyEvaluation.values,
        # The filters for links that choose their own page, and the socket's (the page too, so
        # that its live updates re-render the page shown), both URL-encoded.
        "url_query": urlencode({k: v for k, v in filters.items() if v and k != "page"}),
        "live_query": urlencode(
            {k: v for k, v in filters.items() if v and not (k == "page" and v == "1")}
        ),
    }


# -- the job page --------------------------------------------------------------------------------


def job_context(job: Job, user=None, query=None) -> dict:
    """The job page's context; ``query`` is the page's (its logs' filters). ``job`` is read
    with its history and its ``submitted_by``."""
    history = getattr(job, "history", None)
    ended = job.status in JOB_TERMINAL and history is not None and history.summary
    snapshot = history.summary if ended else job_summary.snapshot(job)
    return {
        **job_sections.sections(job.id, snapshot, query or {}),
        "job": job,
        # In the live part of the page: the button goes as soon as the job has ended.
        "can_cancel": bool(user and user.has_perm(CANCEL_JOB)) and job.status not in JOB_TERMINAL,
        "pipelines": snapshot["pipelines"],
        "checkpoints": snapshot["checkpoints"],
        "metrics": snapshot["metrics"],
        "cleanup": JobCleanupRecord.objects.filter(
            job_id=job.id, kind=CleanupKind.JOB_STATE
        ).first(),
        "dirty": dirty.job_summary(job),
        "facts": job_facts.facts(job, snapshot),
        "episodes": dirty.job_episodes(job),
        "sparkline": throughput.sparkline(throughput.recent(job.id)),
        "throughput": (throughput.recent(job.id, 1) or [None])[-1],
    }


#: The recent jobs the cluster page lists.
RECENT_JOBS = 20


def cluster_context(query, user=None) -> dict:
    # ``?recovery=`` is the API's ``evaluationStatus`` under the page's own name.
    recovery = accepted(
        JobFilter, {"evaluationStatus": query.get("recovery", "")}, ["evaluationStatus"]
    )
    grid: dict[str, list[dict]] = {}
    for slot in queries.slots():
        grid.setdefault(slot["member"]["name"], []).append(slot)
    return {
        "overview": queries.overview(),
        "members": queries.members()[:200],
        "slot_grid": sorted(grid.items()),
        "feed": queries.recent_events(20),
        "jobs": filtered(JobFilter, recovery, queries.jobs_with_rows())[:RECENT_JOBS],
        "recovery": recovery["evaluationStatus"],
        "recovery_choices": DirtyEvaluation.values,
        "can_drain": bool(user and user.has_perm(DRAIN_MEMBER)),
    }


# -- the socket's fragments ----------------------------------------------------------------------


def fragments(topic: str, query: dict, user, seq: int) -> str:
    """The changed parts of the page as htmx out-of-band swaps, and the ``seq`` they show."""
    context = {"user": user, "oob": True}
    if topic == "jobs":
        body = render_to_string("dashboard/htmx/jobs.html", {**context, **jobs_context(query)})
    elif topic == "cluster":
        data = {**context, **cluster_context(query, user)}
        inner = render_to_string("dashboard/htmx/cluster.html", data)
        body = f'<div id="cluster" hx-swap-oob="innerHTML">{inner}</div>'
    else:
        job = (
            Job.objects.select_related("history", "submitted_by")
            .filter(id=int(topic.split(".")[1]))
            .first()
        )
        if job is None:
            body = ""
        else:
            data = {**context, **job_context(job, user, query)}
            inner = render_to_string("dashboard/htmx/job.html", data)
            body = f'<div id="job" hx-swap-oob="innerHTML">{inner}</div>'
    return f'{body}<span id="live-seq" data-seq="{seq}" hx-swap-oob="true"></span>'
