"""``GET /metrics``: the Prometheus exposition (engine.metrics), for a scraper.

Who may scrape (``engine.metrics.*``): a caller from a loopback address while
``metrics.loopback`` is on (the default outside production; behind a reverse proxy on the
same host every caller looks local unless that proxy is in ``KEEL_TRUSTED_PROXIES``),
``Authorization: Bearer <KEEL_METRICS_TOKEN>`` when that is set, or any API token or session
of a user with the viewer role. The first two need no database: while PostgreSQL is down a
scraper with the token still reads ``keel_database_up 0``; a token or session cannot be
checked then (503).
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from engine.clientaddr import client_address, parse, trusted
from engine.dbsession import session_lost
from engine.metrics import CONTENT_TYPE, exposition
from engine.roles import VIEW_JOB


def _loopback(request: HttpRequest) -> bool:
    """The caller (through trusted proxies only: a forwarded header from anyone else is no
    claim to be local) is on a loopback address."""
    address = parse(client_address(request))
    # A trusted proxy that forwarded no client leaves the walk at itself: that is no local
    # caller (a local reverse proxy would make every caller one).
    return (
        address is not None
        and address.is_loopback
        and not trusted(address, settings.TRUSTED_PROXIES)
    )


def _allowed(request: HttpRequest) -> bool:
    options = settings.ENGINE
    if options["metrics.loopback"] and _loopback(request):
        return True
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    secret = options["metrics.token"]
    if scheme == "Bearer" and secret and hmac.compare_digest(credential.encode(), secret.encode()):
        return True
    if scheme == "Token" and credential:
        try:  # the API's own token check (an inactive user's token is refused there too)
            user, _ = TokenAuthentication().authenticate_credentials(credential)
        except AuthenticationFailed:
            return False
        return user.has_perm(VIEW_JOB)
    user = getattr(request, "user", None)
    return bool(user and user.is_authenticated and user.has_perm(VIEW_JOB))


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    try:
        allowed = _allowed(request)
    except DatabaseError as exc:
        if not session_lost(exc):
            raise
        return HttpResponse(
            "the database is unreachable: only the scrape token or a loopback caller can be "
            "checked without it\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
    if not allowed:
        return HttpResponse(
            "metrics need a scrape token, a viewer's API token, or a loopback caller\n",
            status=401,
            content_type="text/plain; charset=utf-8",
            headers={"WWW-Authenticate": 'Bearer realm="keel-metrics"'},
        )
    return HttpResponse(exposition(), content_type=CONTENT_TYPE)
