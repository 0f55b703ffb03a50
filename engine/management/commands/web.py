"""``manage.py web --port P``: the ASGI web process (daphne): dashboard, REST, /ws/, admin."""

from __future__ import annotations

import os
import sys

from django.core.management.base import BaseCommand

from engine.services import require_services


class Command(BaseCommand):
    help = "Serve the dashboard, REST API, WebSockets and admin with daphne"

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args, **opts):
        require_services(postgres=True, redis=True)
        daphne = os.path.join(os.path.dirname(sys.executable), "daphne")
        argv = [
            daphne,
            "-b",
            opts["host"],
            "-p",
            str(opts["port"]),
            "--proxy-headers",
            "keel.asgi:application",
        ]
        sys.stdout.flush()
        os.execv(daphne, argv)
