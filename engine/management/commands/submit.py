"""``manage.py submit -c FILE`` (``./run submit``, as SeaTunnel's ``seatunnel.sh -c``): submit a
job config through the REST API, print its id, and follow it until it ends (``--async``: return
at once). Exit status: 0 FINISHED, 1 FAILED, 2 CANCELED or refused, 3 no answer in time."""

from __future__ import annotations

import sys
import time

from django.core.management.base import BaseCommand, CommandError

from engine.management.apiclient import ApiClient, ApiError, resolve_user_path
from engine.states import JOB_TERMINAL, JobStatus

#: Seconds between two reads of a job being followed.
POLL = 0.5
#: The exit status of each way a job ends.
EXIT_STATUS = {JobStatus.FINISHED: 0, JobStatus.FAILED: 1, JobStatus.CANCELED: 2}


def progress_line(job: dict) -> str:
    """``job 7 RUNNING: 1200 rows read, 1100 written, 450 rows/s`` from the API's detail."""
    metrics = job.get("metrics") or {}
    return (
        f"job {job['jobId']} {job['jobStatus']}: {metrics.get('sourceReceivedCount', 0)} rows "
        f"read, {metrics.get('sinkWriteCount', 0)} written, "
        f"{metrics.get('rowsPerSecond', 0):.0f} rows/s"
    )


class Command(BaseCommand):
    help = "Submit a job config (HOCON or JSON) and follow it until it ends (--async: don't)"

    def add_arguments(self, parser):
        parser.add_argument("file", nargs="?", help="the job config (or -c FILE)")
        parser.add_argument("-c", "--config", help="the job config, as SeaTunnel's -c")
        parser.add_argument(
            "--async",
            dest="detach",
            action="store_true",
            help="return once the job is submitted instead of following it",
        )
        parser.add_argument(
            "--wait", action="store_true", help="follow the job until it ends (the default)"
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
            help="give up following after this many seconds (0: never; exit status 3)",
        )

    def handle(self, *args, **opts):
        if bool(opts["file"]) == bool(opts["config"]):
            raise CommandError("give the job config once: -c FILE (or FILE)", returncode=2)
        if opts["detach"] and opts["wait"]:
            raise CommandError("--async and --wait contradict each other", returncode=2)
        path = resolve_user_path(opts["config"] or opts["file"])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {path}: {exc}", returncode=2) from None
        variables = {}
        for item in opts["variable"]:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise CommandError(f"-i {item}: expected NAME=VALUE", returncode=2)
            variables[name] = value
        body = {"config": text, "variables": variables}
        if opts.get("name"):
            body["jobName"] = opts["name"]
        client = ApiClient()
        status, answer = client.call("POST", "/jobs", body)
        if status == 400 and isinstance(answer, dict) and "errors" in answer:
            for error in answer["errors"]:
                where = error.get("path") or "config"
                if error.get("line"):
                    where += f" (line {error['line']})"
                self.stderr.write(f"{path}: {where}: {error['message']}")
            sys.exit(2)
        if status != 201:
            raise ApiError(status, answer, "submit")
        for warning in answer.get("warnings", []):
            self.stderr.write(f"{path}: warning: {warning['path']}: {warning['message']}")
        self.stdout.write(str(answer["jobId"]))
        self.stdout.flush()
        if not opts["detach"]:
            sys.exit(self.follow(client, answer["jobId"], opts["timeout"]))

    def follow(self, client: ApiClient, job_id: int, timeout: float) -> int:
        """Show the job's progress until it ends; its exit status."""
        deadline = time.monotonic() + timeout if timeout else None
        tty = sys.stderr.isatty()
        last = ""
        while True:
            job = client.expect("GET", f"/jobs/{job_id}", 200, f"reading job {job_id}")
            line = progress_line(job)
            if line != last:
                self.stderr.write(("\r" + line) if tty else line, ending="" if tty else "\n")
                last = line
            if job["jobStatus"] in JOB_TERMINAL:
                if tty:
                    self.stderr.write("")
                self.stderr.write(outcome(job))
                return EXIT_STATUS[job["jobStatus"]]
            if deadline and time.monotonic() > deadline:
                self.stderr.write(f"gave up waiting after {timeout:.0f}s (job {job_id} goes on)")
                return 3
            time.sleep(POLL)  # polling the API between reads, with the deadline above


def outcome(job: dict) -> str:
    """One sentence on how the job ended."""
    status, job_id = job["jobStatus"], job["jobId"]
    if status == JobStatus.FINISHED:
        return f"job {job_id} finished"
    if status == JobStatus.CANCELED:
        by = job.get("canceledBy")
        return f"job {job_id} was canceled" + (f" by {by}" if by else "")
    return f"job {job_id} failed: {job.get('errorMsg') or 'no error message'}"
