"""``manage.py master``: a candidate for active master (run two or three)."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand

from engine.management.engine_process import start_engine_process
from engine.master import commands
from engine.master.loop import Master, MasterOptions


class Command(BaseCommand):
    help = "Run a master candidate: election, membership monitoring, and (when active) the engine"
    # The checks are the web's and migrate's (URLs, admin, templates): an engine process
    # loads none of those apps (engine.process) and starts without them.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--name", default=os.environ.get("KEEL_PROCESS_NAME", "master-1"))
        parser.add_argument(
            "--heartbeat-timeout",
            type=float,
            default=settings.ENGINE["heartbeat-timeout"],
            help="seconds without a heartbeat before a member is REMOVED",
        )
        parser.add_argument(
            "--lease-timeout",
            type=float,
            default=settings.ENGINE["master-lease-timeout"],
            help="seconds a frozen active master keeps leadership",
        )

    def handle(self, *args, **opts):
        master = Master(start_engine_process(MasterOptions, opts))
        master.install_signal_handlers()
        commands.outbox.warm()  # a standby publishes its first commands at once on takeover
        master.run()
