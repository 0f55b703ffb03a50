"""``manage.py web --port P``: the ASGI web process (daphne): dashboard, REST, /ws/, admin."""

from __future__ import annotations

import os
import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from engine.dbsession import GUARDED_SESSIONS_ENV
from engine.services import require_services


class Command(BaseCommand):
    help = "Serve the dashboard, REST API, WebSockets and admin with daphne"

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args, **opts):
        require_services(postgres=True, redis=True)
        # A frozen web process must not stall the engine: its sessions get the engine's
        # timeouts (an open transaction, with the job or event-append lock, is ended).
        os.environ[GUARDED_SESSIONS_ENV] = "1"
        # Connection checks of the jobs it takes run in workers, not here.
        settings.ENGINE["connectors.check-in-workers"] = True
        sys.stdout.flush()
        # daphne runs in this interpreter, so Django is set up once (keel.asgi finds it ready).
        # No --proxy-headers: daphne would believe any caller's X-Forwarded-For. The client's
        # address is resolved in Django instead, from trusted proxies only (engine.clientaddr).
        from daphne.cli import CommandLineInterface

        CommandLineInterface().run(
            ["-b", opts["host"], "-p", str(opts["port"]), "keel.asgi:application"]
        )
