"""``manage.py submit FILE [--wait]`` (``./run submit``): submit a job config, print its id."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Sum

from engine.jobconfig import ConfigError
from engine.jobs.submission import submit_job
from engine.models import Job, TaskGroup
from engine.services import require_services
from engine.states import JOB_TERMINAL, JobStatus


class Command(BaseCommand):
    help = "Submit a job config (HOCON or JSON); with --wait, follow it until it ends"

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument(
            "--wait",
            action="store_true",
            help="show progress until the job ends; exit non-zero unless FINISHED",
        )
        parser.add_argument("--name", help="job name (overrides env.job.name)")
        parser.add_argument(
            "-i",
            "--variable",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a value for ${NAME} in the config (repeatable; as SeaTunnel's -i)",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=0,
            help="with --wait: give up after this many seconds (0: never)",
        )

    def handle(self, *args, **opts):
        path = Path(opts["file"])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {path}: {exc}") from None
        variables = {}
        for item in opts["variable"]:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise CommandError(f"-i {item}: expected NAME=VALUE")
            variables[name] = value
        require_services(redis=False)
        try:
            job = submit_job(text, opts.get("name"), variables)
        except ConfigError as exc:
            for error in exc.errors:
                where = error.get("path") or "config"
                if error.get("line"):
                    where += f" (line {error['line']})"
                self.stderr.write(f"{path}: {where}: {error['message']}")
            sys.exit(2)
        for warning in job.warnings:
            self.stderr.write(f"{path}: warning: {warning['path']}: {warning['message']}")
        self.stdout.write(str(job.id))
        self.stdout.flush()
        if opts["wait"]:
            sys.exit(self.follow(job.id, opts["timeout"]))

    def follow(self, job_id: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout if timeout else None
        tty = sys.stderr.isatty()
        last = ""
        while True:
            job = Job.objects.get(id=job_id)
            totals = TaskGroup.objects.filter(job_id=job_id).aggregate(
                rows=Sum("source_received"),
                written=Sum("sink_written"),
                rate=Sum("rows_per_second"),
            )
            line = (
                f"job {job_id} {job.status}: {totals['rows'] or 0} rows read, "
                f"{totals['written'] or 0} written, {totals['rate'] or 0:.0f} rows/s"
            )
            if line != last:
                self.stderr.write(("\r" + line) if tty else line, ending="" if tty else "\n")
                last = line
            if job.status in JOB_TERMINAL:
                if tty:
                    self.stderr.write("")
                if job.error_msg:
                    self.stderr.write(f"error: {job.error_msg}")
                return 0 if job.status == JobStatus.FINISHED else 1
            if deadline and time.monotonic() > deadline:
                self.stderr.write(f"gave up waiting after {timeout:.0f}s")
                return 1
            time.sleep(0.5)
