"""Dashboard pages: one view per page, returning the full page or its htmx partial."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from engine import queries


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
@require_GET
def cluster(request: HttpRequest) -> HttpResponse:
    context = {
        "overview": queries.overview(),
        "members": queries.members()[:200],
        "jobs": queries.recent_jobs(),
    }
    if request.headers.get("HX-Request"):
        return render(request, "dashboard/htmx/cluster.html", context)
    return render(request, "dashboard/cluster.html", context)
