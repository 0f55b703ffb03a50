"""``manage.py cluster up|status|kill|stop|start|drain|down`` (``./run cluster ...``)."""

from __future__ import annotations

import json
import signal

from django.core.management.base import BaseCommand, CommandError

from devcluster.drain import drain_worker
from devcluster.early import add_up_arguments
from devcluster.localcluster import ClusterError, ClusterSpec, LocalCluster
from engine.services import require_services


class Command(BaseCommand):
    help = "Manage the local cluster: web, masters and workers as background processes"
    # The checks are the web's and migrate's; `./run cluster start` is on an operator's
    # critical path after a fault.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        up = sub.add_parser("up", help="start the cluster and wait until it is healthy")
        add_up_arguments(up)
        sub.add_parser("status", help="JSON: each process's name, pid and whether it is alive")
        for action, text in (
            ("kill", "SIGKILL a process"),
            ("stop", "SIGTERM a process"),
        ):
            p = sub.add_parser(action, help=text)
            p.add_argument("name")
        start = sub.add_parser(
            "start", help="start processes that are not running and wait until they are ready"
        )
        start.add_argument("name", nargs="+")
        drain = sub.add_parser(
            "drain",
            help="drain a worker through the API (a planned leave): its task groups move to "
            "other members, then it leaves the cluster",
        )
        drain.add_argument("name", help="the worker's process name (as in `cluster status`)")
        drain.add_argument("--reason", default="maintenance", help="why (audited)")
        drain.add_argument(
            "--force", action="store_true", help="even if the others lack free slots"
        )
        drain.add_argument("--no-wait", action="store_true", help="return once requested")
        drain.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS")
        sub.add_parser("down", help="stop every process of the cluster")

    def handle(self, *args, **opts):
        cluster = LocalCluster()
        action = opts["action"]
        try:
            if action == "up":
                self.up(cluster, opts)
            elif action == "status":
                self.stdout.write(json.dumps(cluster.status(), indent=2))
            elif action == "kill":
                pid = cluster.signal(opts["name"], signal.SIGKILL)
                cluster.wait_exit(opts["name"], 5)
                self.stdout.write(f"killed {opts['name']} (pid {pid})")
            elif action == "stop":
                pid = cluster.signal(opts["name"], signal.SIGTERM)
                if not cluster.wait_exit(opts["name"], 30):
                    raise CommandError(f"{opts['name']} (pid {pid}) did not stop within 30s")
                self.stdout.write(f"stopped {opts['name']} (pid {pid})")
            elif action == "start":
                require_services()  # (what started early is stopped again: manage.py)
                for name, pid in cluster.start(*opts["name"]).items():
                    self.stdout.write(f"started {name} (pid {pid})")
            elif action == "drain":
                drained = drain_worker(
                    cluster,
                    opts["name"],
                    opts["reason"],
                    force=opts["force"],
                    wait=not opts["no_wait"],
                    timeout=opts["timeout"],
                    say=self.stdout.write,
                )
                if drained["state"] not in ("LEFT", "DRAINING"):
                    raise CommandError(
                        f"drain of {opts['name']} ended {drained['state']}: {drained['endReason']}"
                    )
            elif action == "down":
                cluster.down()
                self.stdout.write("cluster down")
        except ClusterError as exc:
            raise CommandError(str(exc)) from None

    def up(self, cluster: LocalCluster, opts) -> None:
        for key in ("masters", "workers"):
            if opts[key] < 1:
                raise CommandError(f"--{key} must be at least 1")
        if opts["slots"] < 0:
            raise CommandError("--slots must be 0 or more")
        if opts["heartbeat_timeout"] <= 0:
            raise CommandError("--heartbeat-timeout must be positive")
        require_services()  # (what started early is stopped again: manage.py)
        spec = ClusterSpec.build(
            masters=opts["masters"],
            workers=opts["workers"],
            slots=opts["slots"],
            slot_mode=opts["slot_mode"],
            heartbeat_timeout=opts["heartbeat_timeout"],
            port=opts["port"],
            worker_tags=opts["worker_tags"],
            hosts=opts["host"],
        )
        cluster.up(spec, timeout=opts["timeout"])
        self.stdout.write(
            f"cluster up: web http://127.0.0.1:{spec.port}/, {spec.masters} masters, "
            f"{spec.workers} workers ({spec.slots} {spec.slot_mode.lower()} slots each); "
            f"API token in {cluster.dir.parent / 'api-token'}"
        )
