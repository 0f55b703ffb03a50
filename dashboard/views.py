"""Dashboard pages: one view per page, returning the full page or its htmx partial."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from engine import dirty, queries
from engine.models import Job
from engine.roles import VIEW_JOB
from engine.states import DirtyEvaluation


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
    job = get_object_or_404(Job, id=job_id)
    context = {
        "job": job,
        "pipelines": job.pipelines.order_by("index"),
        "dirty": dirty.job_summary(job),
        "episodes": dirty.job_episodes(job),
    }
    if request.headers.get("HX-Request"):
        return render(request, "dashboard/htmx/job.html", context)
    return render(request, "dashboard/job.html", context)
