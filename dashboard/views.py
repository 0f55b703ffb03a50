"""Dashboard pages: one view per page, returning the full page or its htmx partial."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from dashboard import live
from dashboard.filters import accepted, filtered, page_of
from engine import queries
from engine.api.filters import CleanupRecordFilter, JobHistoryFilter
from engine.jobconfig import ConfigError
from engine.jobs.cancel import JobStateError, cancel_job
from engine.jobs.drain import DrainRefused, request_drain
from engine.jobs.submission import WorkersUnavailable, submit_job
from engine.models import Job, JobCleanupRecord
from engine.roles import CANCEL_JOB, DRAIN_MEMBER, SUBMIT_JOB, VIEW_JOB
from engine.states import JOB_TERMINAL, CleanupKind, CleanupState
from history.models import JobHistory


def viewer_page(view):
    """A page any role may read: signed in, with the viewer's permission, GET only."""
    return login_required(permission_required(VIEW_JOB, raise_exception=True)(require_GET(view)))


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Unauthenticated liveness of the web process and its database (for load balancers)."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return JsonResponse({"status": "ok", "database": "ok"})
    except Exception:
        return JsonResponse({"status": "error", "database": "unreachable"}, status=503)


@viewer_page
def cluster(request: HttpRequest) -> HttpResponse:
    """The cluster: master, members, slots, recent jobs (live over the socket)."""
    seq = queries.latest_seq()  # before the data: what changes after reaches the page
    context = live.cluster_context(request.GET, request.user)
    return _render(request, "cluster", {"seq": seq, **context})


@viewer_page
def jobs(request: HttpRequest) -> HttpResponse:
    """Jobs with their status and health badges, filters in the URL (live over the socket)."""
    seq = queries.latest_seq()
    return _render(request, "jobs", {"seq": seq, **live.jobs_context(request.GET)})


@viewer_page
def job(request: HttpRequest, job_id: int) -> HttpResponse:
    """One job: status, graph, pipelines, checkpoints, exceptions, dirty-job label, recovery
    episodes, events and logs (``?logLevel=&logTaskGroup=``), live."""
    seq = queries.latest_seq()
    job = get_object_or_404(Job.objects.select_related("history", "submitted_by"), id=job_id)
    return _render(request, "job", {"seq": seq, **live.job_context(job, request.user, request.GET)})


def _page(request: HttpRequest, queryset) -> tuple[list, dict]:
    """One page of ``queryset`` (``?page=``), and what the template needs to move between."""
    page = page_of(queryset, request.GET.get("page"))
    return list(page.object_list), {"page": page, "count": page.paginator.count}


def _render(request: HttpRequest, name: str, context: dict) -> HttpResponse:
    if request.headers.get("HX-Request"):
        return render(request, f"dashboard/htmx/{name}.html", context)
    return render(request, f"dashboard/{name}.html", context)


@viewer_page
def finished_jobs(request: HttpRequest) -> HttpResponse:
    """Finished jobs from their history (``?jobStatus=`` as the API), newest first."""
    filters = accepted(JobHistoryFilter, request.GET, ["jobStatus"])
    status = filters["jobStatus"]
    records = JobHistory.objects.select_related("job").order_by("-finished_at", "-job_id")
    rows, paging = _page(request, filtered(JobHistoryFilter, filters, records))
    return _render(
        request,
        "history",
        {"rows": rows, "status": status, "statuses": [s.value for s in JOB_TERMINAL], **paging},
    )


@viewer_page
def cleanup_records(request: HttpRequest) -> HttpResponse:
    """Cleanup records, read-only (``?state=``, ``?kind=``, ``?jobId=`` as the API); staff
    follow a record to the admin console to act on it."""
    filters = accepted(CleanupRecordFilter, request.GET, ["state", "kind", "jobId"])
    records = JobCleanupRecord.objects.order_by("-due_at", "-id")
    rows, paging = _page(request, filtered(CleanupRecordFilter, filters, records))
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


@login_required
@permission_required(VIEW_JOB, raise_exception=True)
def submit(request: HttpRequest) -> HttpResponse:
    """Write or paste a config (or start from an example); its errors show at their line. Only
    operators may submit; others see the editor read-only."""
    examples = {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted((Path(settings.BASE_DIR) / "examples").glob("*.conf"))
    }
    text = request.POST.get("config", "") if request.method == "POST" else ""
    if request.method == "GET" and request.GET.get("example") in examples:
        text = examples[request.GET["example"]]
    errors: list[dict] = []
    if request.method == "POST":
        if not request.user.has_perm(SUBMIT_JOB):
            return HttpResponse("submitting needs the operator role", status=403)
        try:
            job = submit_job(text, request.POST.get("jobName") or None, submitted_by=request.user)
        except ConfigError as exc:
            errors = exc.errors
        except WorkersUnavailable as exc:
            errors = [{"path": "config", "message": str(exc)}]
        else:
            for warning in job.warnings:
                messages.warning(request, f"{warning['path']}: {warning['message']}")
            return redirect("job", job_id=job.id)
    lines = text.split("\n") if text else [""]
    by_line: dict[int, list[dict]] = {}
    for error in errors:
        line = int(error.get("line") or 0) or _line_of(text, error.get("path", ""))
        by_line.setdefault(line, []).append(error)
    numbered = [(n, line, by_line.get(n, [])) for n, line in enumerate(lines, start=1)]
    return render(
        request,
        "dashboard/submit.html",
        {
            "text": text,
            "errors": errors,
            "unplaced": by_line.get(0, []),
            "numbered": numbered,
            "examples": sorted(examples),
            "may_submit": request.user.has_perm(SUBMIT_JOB),
        },
        status=400 if errors else 200,
    )


def _line_of(text: str, path: str) -> int:
    """The line an error without one is about: where its last key is written (0: unknown)."""
    key = path.rsplit(".", 1)[-1] if "." in path else ""
    if not key or not re.fullmatch(r"[\w.-]+", key):
        return 0
    found = re.search(rf"(^|[\s{{,]){re.escape(key)}\s*[=:]", text, re.M)
    return (
        text.count("\n", 0, found.start()) + 1 + (1 if found.group(1) == "\n" else 0)
        if found
        else 0
    )


@login_required
@require_POST
def cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    """Cancel a job from its page (operators; CSRF-protected like every form)."""
    if not request.user.has_perm(CANCEL_JOB):
        return HttpResponse("cancelling needs the operator role", status=403)
    get_object_or_404(Job, id=job_id)
    try:
        cancel_job(job_id, by=request.user)
    except JobStateError:
        pass  # ended meanwhile: the page shows how
    if request.headers.get("HX-Request"):
        return HttpResponse(status=204)  # the live page shows what follows
    return redirect("job", job_id=job_id)


def moved(name: str):
    """A dashboard path from before the trailing slash: a permanent redirect to the canonical
    one that keeps the method and body (308), so a form posted to the old path still works."""

    def view(request: HttpRequest, **kwargs) -> HttpResponse:
        url = reverse(name, kwargs=kwargs)
        if request.META.get("QUERY_STRING"):
            url = f"{url}?{request.META['QUERY_STRING']}"
        return HttpResponsePermanentRedirect(url, preserve_request=True)

    return view


@login_required
@require_POST
def drain(request: HttpRequest, member_uuid) -> HttpResponse:
    """Drain a member from the cluster page (operators, after the dialog's confirmation)."""
    if not request.user.has_perm(DRAIN_MEMBER):
        return HttpResponse("draining needs the operator role", status=403)
    try:
        record, created = request_drain(
            member_uuid,
            request.user,
            request.POST.get("reason", ""),
            force=request.POST.get("force") == "on",
        )
    except DrainRefused as exc:
        messages.error(request, f"not drained: {exc}")
    else:
        name = record.member.name
        messages.success(
            request,
            f"draining {name}: its task groups move away, then it leaves"
            if created
            else f"{name} is being drained already",
        )
    return redirect("cluster")
