"""``manage.py jobs list|status ID|cancel ID|rescale ID N`` (``./run jobs``): the jobs through
the REST API, with a token, as SeaTunnel's ``-l`` and ``-can``."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from engine.management.apiclient import ApiClient, ApiError
from engine.management.commands.submit import progress_line


class Command(BaseCommand):
    help = "List jobs, show one, cancel or rescale one (through the REST API)"

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        listing = actions.add_parser("list", help="the newest jobs first")
        listing.add_argument("--status", help="only jobs in this status (e.g. RUNNING)")
        listing.add_argument("--limit", type=int, default=50, help="at most this many (50)")
        for name, text in (("status", "one job's state"), ("cancel", "cancel a job")):
            actions.add_parser(name, help=text).add_argument("job_id", type=int)
        rescale = actions.add_parser(
            "rescale", help="restore a running Lane A job's pipelines with N readers each"
        )
        rescale.add_argument("job_id", type=int)
        rescale.add_argument("parallelism", type=int, help="the readers of each pipeline")

    def handle(self, *args, **opts):
        client = ApiClient()
        action = opts["action"]
        if action == "list":
            query = f"?pageSize={max(1, min(opts['limit'], 500))}"
            if opts["status"]:
                query += f"&jobStatus={opts['status'].upper()}"
            page = client.expect("GET", f"/jobs{query}", 200, "listing jobs")
            for job in page["results"]:
                self.stdout.write(
                    f"{job['jobId']:>6}  {job['jobStatus']:<10} {job['createTime']}  "
                    f"{job['jobName']}"
                )
            return
        job_id = opts["job_id"]
        if action == "rescale":
            wanted = opts["parallelism"]
            what = f"rescale of job {job_id}"
            status, answer = client.call("POST", f"/jobs/{job_id}/rescale", {"parallelism": wanted})
            if status == 400 and isinstance(answer, dict) and "errors" in answer:
                errors = "; ".join(f"{e.get('path')}: {e['message']}" for e in answer["errors"])
                raise CommandError(f"{what} refused (400): {errors}", returncode=2)
            if status != 202:
                raise ApiError(status, answer, what)
            self.stdout.write(f"job {job_id} rescaling to parallelism {wanted}")
            return
        if action == "cancel":
            job = client.expect("POST", f"/jobs/{job_id}/cancel", 202, f"cancel of job {job_id}")
            self.stdout.write(f"job {job_id} {job['jobStatus']}")
            return
        job = client.expect("GET", f"/jobs/{job_id}", 200, f"reading job {job_id}")
        self.stdout.write(progress_line(job))
        for label, key in (
            ("name", "jobName"),
            ("submitted by", "submittedBy"),
            ("canceled by", "canceledBy"),
            ("created", "createTime"),
            ("finished", "finishTime"),
            ("pending", "pendingReason"),
            ("error", "errorMsg"),
        ):
            if job.get(key):
                self.stdout.write(f"  {label}: {job[key]}")
