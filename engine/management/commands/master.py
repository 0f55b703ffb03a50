"""``manage.py master``: a candidate for active master (run two or three)."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand

from engine.dbsession import configure_engine_sessions
from engine.master.loop import Master, MasterOptions
from engine.services import require_services


class Command(BaseCommand):
    help = "Run a master candidate: election, membership monitoring, and (when active) the engine"

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
        require_services(postgres=True, redis=True)
        configure_engine_sessions()
        master = Master(
            MasterOptions(
                name=opts["name"],
                heartbeat_timeout=opts["heartbeat_timeout"],
                lease_timeout=opts["lease_timeout"],
            )
        )
        master.install_signal_handlers()
        master.run()
