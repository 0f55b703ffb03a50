"""``manage.py demo`` (``./run demo``): a local cluster to look at, until Ctrl-C."""

from __future__ import annotations

import random
import signal
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from devcluster.examples import (
    DEMO_SET,
    EXAMPLES_DIR,
    prepare_examples_db,
    save_examples_connection,
)
from devcluster.localcluster import ClusterError, ClusterSpec, LocalCluster, ensure_admin
from engine.jobconfig import ConfigError
from engine.jobs.submission import submit_job
from engine.services import require_services
from engine.states import SlotMode


class Command(BaseCommand):
    help = "Start a local cluster (web, 2 masters, 3 workers) and run it until Ctrl-C"

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--masters", type=int, default=2)
        parser.add_argument("--workers", type=int, default=3)
        parser.add_argument("--slots", type=int, default=8)
        parser.add_argument(
            "--chaos",
            action="store_true",
            help="kill a random worker every --chaos-interval seconds and start it again "
            "(badges go DIRTY, episodes appear)",
        )
        parser.add_argument("--chaos-interval", type=float, default=30.0)

    def submit_examples(self) -> str:
        """Submit the representative set of example jobs; a line saying what went in."""
        save_examples_connection(prepare_examples_db(settings.DATABASE_URL), settings.DATABASE_URL)
        done = []
        for name in DEMO_SET:
            path = EXAMPLES_DIR / name
            try:
                job = submit_job(path.read_text(encoding="utf-8"))
            except ConfigError as exc:
                self.stderr.write(f"example {name} was not submitted: {exc}")
                continue
            done.append(f"{job.id} {job.name}")
        return ", ".join(done) or "none"

    def handle(self, *args, **opts):
        require_services()
        cluster = LocalCluster()
        spec = ClusterSpec.build(
            masters=opts["masters"],
            workers=opts["workers"],
            slots=opts["slots"],
            slot_mode=SlotMode.FIXED,
            heartbeat_timeout=settings.ENGINE["heartbeat-timeout"],
            port=opts["port"],
        )
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        try:
            cluster.up(spec)
        except ClusterError as exc:
            raise CommandError(str(exc)) from None
        try:
            username, password, token = ensure_admin(cluster.dir.parent)
            submitted = self.submit_examples()
            self.stdout.write(
                "\n".join(
                    [
                        "",
                        "Keel demo cluster is up.",
                        f"  Dashboard:  http://127.0.0.1:{spec.port}/",
                        f"  Login:      {username} / {password}",
                        f"  API token:  {token}   (also in {cluster.dir.parent / 'api-token'})",
                        f"  Role tokens: {cluster.dir.parent / 'api-token-viewer'}, "
                        f"{cluster.dir.parent / 'api-token-operator'}",
                        f"  Try:        curl -H 'Authorization: Token {token}' "
                        f"http://127.0.0.1:{spec.port}/api/v1/overview",
                        f"  Processes:  {', '.join(p.name for p in spec.processes)} "
                        f"(logs in {cluster.dir})",
                        f"  Jobs:       {submitted}",
                        "  Submit:     ./run submit -c examples/fake_to_blackhole.batch.conf",
                        "  Chaos:      a random worker is killed every "
                        f"{opts['chaos_interval']:g} s and started again"
                        if opts["chaos"]
                        else "  Chaos:      off (./run demo --chaos kills a worker every 30 s)",
                        "Press Ctrl-C to stop everything.",
                        "",
                    ]
                )
            )
            self.stdout.flush()
            chaos = Chaos(cluster, spec, opts["chaos_interval"]) if opts["chaos"] else None
            while not stop.wait(1.0):
                if chaos is not None:
                    chaos.step(self.stdout)
        finally:
            self.stdout.write("stopping the demo cluster...")
            cluster.down()
            self.stdout.write("demo stopped")


class Chaos:
    """Every ``interval`` seconds, SIGKILL one worker at random and start it again (it joins as
    a new member): the jobs it served restore, and tracked ones count the attempts."""

    def __init__(self, cluster: LocalCluster, spec: ClusterSpec, interval: float) -> None:
        self.cluster = cluster
        self.workers = [p.name for p in spec.processes if p.name.startswith("worker-")]
        self.interval = interval
        self.next_at = time.monotonic() + interval
        self.random = random.Random()

    def step(self, out) -> None:
        if time.monotonic() < self.next_at or not self.workers:
            return
        self.next_at = time.monotonic() + self.interval
        victim = self.random.choice(self.workers)
        try:
            self.cluster.signal(victim, signal.SIGKILL)
            self.cluster.wait_exit(victim, 10)
            self.cluster.start(victim)
            out.write(f"chaos: killed and restarted {victim}")
        except ClusterError as exc:
            out.write(f"chaos: {victim}: {exc}")
