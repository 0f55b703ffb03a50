"""Dashboard pages: one view per page, returning the full page or its htmx partial."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from engine import dirty, queries
from engine.jobs import summary as job_summary
from engine.models import Job, JobCleanupRecord
from engine.roles import VIEW_JOB
from engine.states import JOB_TERMINAL, CleanupKind, CleanupState, DirtyEvaluation
from history.models import JobHistory


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Unauthenticated liveness of the web process and its database (for load balancers)."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return JsonResponse({"status": "ok", "database": "ok"})
    except Exception:
        return JsonResponse({"status": "error", "database": "unreachable"}, status=503)


@login_required
@permission_required(VIEW_JOB, raise_exception=True)
@require_GET
def cluster(request: HttpRequest) -> HttpResponse:
    recovery = request.GET.get("recovery", "")
    if recovery not in DirtyEvaluation.values:
        recovery = ""  # any other value: all jobs
    context = {
        "overview": queries.overview(),
        "members": queries.members()[:200],
        "jobs": queries.recent_jobs(recovery=recovery or None),
        "recovery": recovery,
        "recovery_choices": DirtyEvaluation.values,
    }
    if request.headers.get("HX-Request"):
        return render(request, "dashboard/htmx/cluster.html", context)
    return render(request, "dashboard/cluster.html", context)


@login_required
@permission_required(VIEW_JOB, raise_exception=True)
@require_GET
def job(request: HttpRequest, job_id: int) -> HttpResponse:
    """One job: its status, pipelines, dirty-job label and recovery episodes (live)."""
    job = get_object_or_404(Job.objects.select_related("history"), id=job_id)
    history = getattr(job, "history", None)
    ended = job.status in JOB_TERMINAL and history is not None and history.summary
    snapshot = history.summary if ended else job_summary.snapshot(job)
    context = {
        "job": job,
        "pipelines": snapshot["pipelines"],
        "checkpoints": snapshot["checkpoints"],
        "cleanup": JobCleanupRecord.objects.filter(
            job_id=job.id, kind=CleanupKind.JOB_STATE
        ).first(),
        "dirty": dirty.job_summary(job),
        "episodes": dirty.job_episodes(job),
    }
    if request.headers.get("HX-Request"):
        return render(request, "dashboard/htmx/job.html", context)
    return render(request, "dashboard/job.html", context)


PAGE_SIZE = 50


def _page(request: HttpRequest, queryset) -> tuple[list, dict]:
    """One page of ``queryset`` (``?page=``), and what the template needs to move between."""
    paginator = Paginator(queryset, PAGE_SIZE)
    page = paginator.get_page(request.GET.get("page"))
    return list(page.object_list), {"page": page, "count": paginator.count}


def _render(request: HttpRequest, name: str, context: dict) -> HttpResponse:
    if request.headers.get("HX-Request"):
        return render(request, f"dashboard/htmx/{name}.html", context)
    return render(request, f"dashboard/{name}.html", context)


@login_required
@permission_required(VIEW_JOB, raise_exception=True)
@require_GET
def finished_jobs(request: HttpRequest) -> HttpResponse:
    """Finished jobs from their history (``?jobStatus=`` as the API), newest first."""
    status = request.GET.get("jobStatus", "")
    records = JobHistory.objects.select_related("job").order_by("-finished_at", "-job_id")
    if status in JOB_TERMINAL:
        records = records.filter(status=status)
    else:
        status = ""
    rows, paging = _page(request, records)
    return _render(
        request,
        "history",
        {"rows": rows, "status": status, "statuses": [s.value for s in JOB_TERMINAL], **paging},
    )


@login_required
@permission_required(VIEW_JOB, raise_exception=True)
@require_GET
def cleanup_records(request: HttpRequest) -> HttpResponse:
    """Cleanup records, read-only (``?state=``, ``?kind=``, ``?jobId=`` as the API); staff
    follow a record to the admin console to act on it."""
    records = JobCleanupRecord.objects.order_by("-due_at", "-id")
    filters = {
        "state": request.GET.get("state", ""),
        "kind": request.GET.get("kind", ""),
        "jobId": request.GET.get("jobId", ""),
    }
    if filters["state"] in CleanupState.values:
        records = records.filter(state=filters["state"])
    if filters["kind"] in CleanupKind.values:
        records = records.filter(kind=filters["kind"])
    if filters["jobId"].isdigit():
        records = records.filter(job_id=int(filters["jobId"]))
    rows, paging = _page(request, records)
    return _render(
        request,
        "cleanup",
        {
            "rows": rows,
            "filters": filters,
            "states": CleanupState.values,
            "kinds": CleanupKind.values,
            **paging,
        },
    )
