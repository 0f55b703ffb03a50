"""ASGI entry point: HTTP (dashboard, REST, admin) and WebSockets under /ws/."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

http_application = get_asgi_application()

from engine.dbsession import GUARDED_SESSIONS_ENV, configure_engine_sessions  # noqa: E402

if os.environ.get(GUARDED_SESSIONS_ENV):
    configure_engine_sessions()

import dashboard.routing  # noqa: E402

if not settings.PRODUCTION:
    # Local cluster: daphne serves /static/ itself. Production serves collected static files
    # from a reverse proxy in front of the web process.
    http_application = ASGIStaticFilesHandler(http_application)

application = ProtocolTypeRouter(
    {
        "http": http_application,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(dashboard.routing.websocket_urlpatterns))
        ),
    }
)
