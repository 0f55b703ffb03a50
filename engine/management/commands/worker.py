"""``manage.py worker --name NAME --slots N [--tag KEY=VALUE ...]``: an engine member."""

from __future__ import annotations

import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from engine.cli import add_slot_options, add_tag_option
from engine.cluster.membership import MemberRefused
from engine.management.engine_process import start_engine_process
from engine.member.worker import Worker, WorkerOptions

CONCURRENCY_HELP = "Celery pool threads (they only validate and hand over)"


class Command(BaseCommand):
    help = "Run an engine member (worker): slots, heartbeat, and a Celery worker for its commands"
    # The checks are the web's and migrate's (URLs, admin, templates): an engine process
    # loads none of those apps (engine.process) and starts without them.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="member name, e.g. worker-1")
        add_slot_options(parser)
        add_tag_option(parser)
        parser.add_argument(
            "--heartbeat-interval", type=float, default=settings.ENGINE["heartbeat-interval"]
        )
        parser.add_argument("--concurrency", type=int, default=4, help=CONCURRENCY_HELP)

    def handle(self, *args, **opts):
        if opts["slots"] < 0:
            raise CommandError("--slots must be 0 or more")
        if not opts["name"] or any(c.isspace() or c in "@/" for c in opts["name"]):
            raise CommandError("--name must be a non-empty name without spaces, '@' or '/'")
        opts["tags"] = opts.get("tags") or {}
        worker = Worker(start_engine_process(WorkerOptions, opts))
        try:
            sys.exit(worker.run())
        except MemberRefused as exc:
            raise CommandError(f"cannot join the cluster: {exc}") from None
