"""``manage.py worker --name NAME --slots N``: an engine member."""

from __future__ import annotations

import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from engine.dbsession import configure_engine_sessions
from engine.member.worker import Worker, WorkerOptions
from engine.services import require_services
from engine.states import SlotMode


class Command(BaseCommand):
    help = "Run an engine member (worker): slots, heartbeat, and a Celery worker for its commands"

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="member name, e.g. worker-1")
        parser.add_argument("--slots", type=int, default=8)
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--fixed-slots", dest="slot_mode", action="store_const", const=SlotMode.FIXED
        )
        mode.add_argument(
            "--dynamic-slots", dest="slot_mode", action="store_const", const=SlotMode.DYNAMIC
        )
        parser.set_defaults(slot_mode=SlotMode.FIXED)
        parser.add_argument(
            "--heartbeat-interval", type=float, default=settings.ENGINE["heartbeat-interval"]
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=4,
            help="Celery pool threads (they only validate and hand over)",
        )

    def handle(self, *args, **opts):
        if opts["slots"] < 0:
            raise CommandError("--slots must be 0 or more")
        if not opts["name"] or any(c.isspace() or c in "@/" for c in opts["name"]):
            raise CommandError("--name must be a non-empty name without spaces, '@' or '/'")
        require_services(postgres=True, redis=True)
        configure_engine_sessions()
        worker = Worker(
            WorkerOptions(
                name=opts["name"],
                slots=opts["slots"],
                slot_mode=opts["slot_mode"],
                heartbeat_interval=opts["heartbeat_interval"],
                concurrency=opts["concurrency"],
            )
        )
        sys.exit(worker.run())
