"""SeaTunnel's REST API v2, behind Keel's authentication and roles, so that a client written
for SeaTunnel's engine works against Keel unchanged: the paths, parameters and field names of
SeaTunnel's documentation (numbers as strings where it writes them so). Views translate and
call the same domain functions as ``/api/v1/``.

Not in Keel, and answered as such: savepoints (``isStartWithSavePoint``,
``isStopWithSavePoint``) and client-chosen job ids are a 400.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import queries
from engine.jobconfig import ConfigError
from engine.jobs import summary as job_summary
from engine.jobs.cancel import JobStateError, cancel_job
from engine.jobs.submission import WorkersUnavailable, create_job, plan_config, submit_job
from engine.models import Job
from engine.roles import CANCEL_JOB, SUBMIT_JOB
from engine.states import JOB_TERMINAL

#: SeaTunnel's finished states; SAVEPOINT_DONE and UNKNOWABLE never happen in Keel.
FINISHED_STATES = ("FINISHED", "CANCELED", "FAILED", "SAVEPOINT_DONE", "UNKNOWABLE")
#: Metrics SeaTunnel reports that Keel does not measure (byte rates, queue sizes): always "0".
UNMEASURED = (
    "IntermediateQueueSize",
    "SourceReceivedBytesPerSeconds",
    "SinkWriteBytesPerSeconds",
)


class Refused(Exception):
    """A request Keel cannot honour as SeaTunnel would: a 400 with SeaTunnel's error shape."""


def _time(value) -> str | None:
    """SeaTunnel's time format: local time, to the second."""
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S") if value else None


def _flag(value: Any) -> bool:
    return str(value).strip().lower() == "true"


def _history(job: Job) -> dict:
    history = getattr(job, "history", None)
    return history.summary if job.status in JOB_TERMINAL and history and history.summary else {}


def _job_dag(job: Job, dag: dict) -> dict:
    return {
        "jobId": str(job.id),
        "envOptions": [],
        "pipelineEdges": {
            pipeline: [{"inputVertexId": str(a), "targetVertexId": str(b)} for a, b in pairs]
            for pipeline, pairs in dag.get("edges", {}).items()
        },
        "vertexInfoMap": [
            {
                "vertexId": v["id"],
                "type": v["type"],
                "vertexName": f"{v['path']}",
                "tablePaths": [],
            }
            for v in dag.get("vertices", [])
        ],
    }


def _parts(job: Job) -> tuple[dict, dict]:
    """(jobDag, metrics) of a job: live while its running state is there, else its history."""
    ended = _history(job)
    if ended:
        return _job_dag(job, ended.get("dag", {})), ended["metrics"]
    return _job_dag(job, job_summary.dag(job)), job_summary.metrics(job)


def job_info(job: Job) -> dict:
    """``/job-info``'s shape: always the job and its DAG and metrics; the env while it runs;
    the finish time and error once it ended."""
    dag, metrics = _parts(job)
    body: dict[str, Any] = {
        "jobId": str(job.id),
        "jobName": job.name,
        "jobStatus": job.status,
        "createTime": _time(job.created_at),
        "jobDag": dag,
        "metrics": {
            "SourceReceivedCount": str(metrics["sourceReceivedCount"]),
            "SourceReceivedQPS": str(metrics["rowsPerSecond"]),
            "SinkWriteCount": str(metrics["sinkWriteCount"]),
            "SinkWriteQPS": str(metrics["rowsPerSecond"]),
            # A job that ended before bytes were counted has none in its summary.
            "SourceReceivedBytes": str(metrics.get("sourceReceivedBytes", 0)),
            "SinkWriteBytes": str(metrics.get("sinkWriteBytes", 0)),
            **dict.fromkeys(UNMEASURED, "0"),
        },
    }
    if job.status in JOB_TERMINAL:
        body |= {"finishedTime": _time(job.finished_at), "errorMsg": job.error_msg or None}
    else:
        body |= {"envOptions": job.env, "pluginJarsUrls": [], "isStartWithSavePoint": False}
    return body


def _listed(job: Job, finished: bool) -> dict:
    dag, metrics = _parts(job)
    body = {
        "jobId": str(job.id),
        "jobName": job.name,
        "jobStatus": job.status,
        "createTime": _time(job.created_at),
        "jobDag": dag,
    }
    counts = {
        "sourceReceivedCount": str(metrics["sourceReceivedCount"]),
        "sinkWriteCount": str(metrics["sinkWriteCount"]),
    }
    if finished:
        return body | {
            "errorMsg": job.error_msg or None,
            "finishTime": _time(job.finished_at),
            "metrics": counts,
        }
    return body | {
        "envOptions": job.env,
        "pluginJarsUrls": [],
        "isStartWithSavePoint": False,
        "metrics": counts,
    }


def _jobs(queryset) -> Any:
    return job_summary.with_groups(queryset.select_related("history")).order_by("-id")


def _page(request: Request, queryset):
    """SeaTunnel's ``page`` and ``rows`` (both optional: without them, every job)."""
    try:
        rows = int(request.query_params.get("rows", 0))
        page = max(int(request.query_params.get("page", 1)), 1)
    except ValueError:
        raise Refused("page and rows must be whole numbers") from None
    if rows > 0:
        return queryset[(page - 1) * rows : page * rows]
    return queryset


def _refused(message: str, code: int = status.HTTP_400_BAD_REQUEST) -> Response:
    return Response({"status": "fail", "message": message}, status=code)


class JsonOnly(DefaultContentNegotiation):
    """Always JSON: SeaTunnel's ``?format=`` names the config's format, not the answer's."""

    def select_renderer(self, request, renderers, format_suffix=None):
        json_renderer = next(r for r in renderers if r.format == "json")
        return json_renderer, json_renderer.media_type


class SeaTunnelView(APIView):
    """Refusals answer in SeaTunnel's ``{status: fail, message}`` shape."""

    content_negotiation_class = JsonOnly

    def handle_exception(self, exc):
        if isinstance(exc, Refused | ConfigError):
            return _refused(str(exc))
        if isinstance(exc, WorkersUnavailable):
            return _refused(str(exc), status.HTTP_503_SERVICE_UNAVAILABLE)
        return super().handle_exception(exc)


def _config(request: Request) -> str:
    """The submitted config as text: a JSON body (SeaTunnel's default format) or HOCON."""
    fmt = request.query_params.get("format", "json").lower()
    text = request.body.decode("utf-8", errors="replace")
    if fmt not in ("json", "hocon"):
        raise Refused(f"format {fmt!r}: Keel accepts json or hocon")
    if fmt == "json":
        try:
            json.loads(text)
        except ValueError as exc:
            raise Refused(f"the body is not JSON ({exc}); for HOCON, add ?format=hocon") from None
    return text


def _params(params: dict) -> str | None:
    """The job name of SeaTunnel's submit parameters; refuse what Keel does not do."""
    if params.get("jobId") not in (None, ""):
        raise Refused("Keel assigns job ids: submit without jobId")
    if _flag(params.get("isStartWithSavePoint")):
        raise Refused("Keel has no savepoints: submit without isStartWithSavePoint")
    return params.get("jobName") or None


@extend_schema(exclude=True)
class SubmitJobView(SeaTunnelView):
    role_permissions = {"POST": SUBMIT_JOB}

    def post(self, request: Request) -> Response:
        name = _params(request.query_params)
        job = submit_job(_config(request), name, submitted_by=request.user)
        return Response({"jobId": job.id, "jobName": job.name})


@extend_schema(exclude=True)
class SubmitJobsView(SeaTunnelView):
    """Several jobs: every config is planned first, then all are created in one transaction,
    so a bad one submits none."""

    role_permissions = {"POST": SUBMIT_JOB}

    def post(self, request: Request) -> Response:
        items = _body(request)
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise Refused("the body must be a JSON array of job configs")
        plans = []
        for index, item in enumerate(items):
            params = item.get("params") or {}
            if not isinstance(params, dict):
                raise Refused(f"[{index}].params must be an object")
            config = {k: v for k, v in item.items() if k != "params"}
            text = json.dumps(config)
            try:
                plans.append((plan_config(text, _params(params)), text))
            except (ConfigError, Refused) as exc:
                raise Refused(f"[{index}]: {exc}") from None
        with transaction.atomic():
            jobs = [create_job(plan, text, request.user) for plan, text in plans]
        return Response([{"jobId": str(j.id), "jobName": j.name} for j in jobs])


@extend_schema(exclude=True)
class JobInfoView(SeaTunnelView):
    def get(self, request: Request, job_id: int) -> Response:
        job = _jobs(Job.objects.filter(id=job_id)).first()
        if job is None:
            return Response({"jobId": ""})  # SeaTunnel's answer for a job it does not know
        return Response(job_info(job))


@extend_schema(exclude=True)
class RunningJobsView(SeaTunnelView):
    def get(self, request: Request) -> Response:
        jobs = _page(request, _jobs(Job.objects.exclude(status__in=JOB_TERMINAL)))
        return Response([_listed(job, finished=False) for job in jobs])


@extend_schema(exclude=True)
class FinishedJobsView(SeaTunnelView):
    def get(self, request: Request, state: str = "") -> Response:
        state = state.upper()
        if state and state not in FINISHED_STATES:
            raise Refused(f"state {state!r}: one of {', '.join(FINISHED_STATES)}")
        terminal = [state] if state else sorted(JOB_TERMINAL)
        jobs = _page(request, _jobs(Job.objects.filter(status__in=terminal)))
        return Response([_listed(job, finished=True) for job in jobs])


def _stop(request: Request, item: Any) -> dict:
    if not isinstance(item, dict) or "jobId" not in item:
        raise Refused("each stop needs a jobId")
    if _flag(item.get("isStopWithSavePoint")):
        raise Refused("Keel has no savepoints: stop without isStopWithSavePoint")
    try:
        job_id = int(item["jobId"])
    except (TypeError, ValueError):
        raise Refused(f"jobId {item['jobId']!r} is not a job id") from None
    if not Job.objects.filter(id=job_id).exists():
        raise Refused(f"no job {job_id}")
    try:
        cancel_job(job_id, by=request.user)
    except JobStateError:
        pass  # already ended: stopping it again is done
    return {"jobId": job_id}


def _body(request: Request) -> Any:
    try:
        return json.loads(request.body)
    except ValueError as exc:
        raise Refused(f"the body is not JSON ({exc})") from None


@extend_schema(exclude=True)
class StopJobView(SeaTunnelView):
    role_permissions = {"POST": CANCEL_JOB}

    def post(self, request: Request) -> Response:
        return Response(_stop(request, _body(request)))


@extend_schema(exclude=True)
class StopJobsView(SeaTunnelView):
    role_permissions = {"POST": CANCEL_JOB}

    def post(self, request: Request) -> Response:
        items = _body(request)
        if not isinstance(items, list):
            raise Refused("the body must be a JSON array of {jobId, isStopWithSavePoint}")
        return Response([_stop(request, item) for item in items])


@extend_schema(exclude=True)
class OverviewView(SeaTunnelView):
    def get(self, request: Request) -> Response:
        """``?tag=value...`` narrows the workers and slots counted to the members so tagged
        (the job counts stay the cluster's, as in SeaTunnel)."""
        o = queries.overview()
        o["works"] = o["members"]["alive"]
        tags = {k: v for k, v in request.query_params.items() if k != "format"}
        if tags:
            o.update(queries.tagged_workers(tags))
        return Response(
            {
                "projectVersion": _version(),
                "gitCommitAbbrev": "",
                "totalSlot": str(o["totalSlot"]),
                "unassignedSlot": str(o["unassignedSlot"]),
                "works": str(o["works"]),
                "runningJobs": str(o["runningJobs"]),
                "pendingJobs": str(o["pendingJobs"]),
                "finishedJobs": str(o["finishedJobs"]),
                "failedJobs": str(o["failedJobs"]),
                "cancelledJobs": str(o["canceledJobs"]),
            }
        )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("keel")
    except PackageNotFoundError:
        return "unknown"


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _gib(value: int | None) -> str:
    return f"{value / 2**30:.1f}G" if value is not None else "0"


@extend_schema(exclude=True)
class SystemMonitoringView(SeaTunnelView):
    """This web process's host, in SeaTunnel's keys (the ones that mean something outside a
    JVM); one entry, as for a one-node SeaTunnel cluster."""

    def get(self, request: Request) -> Response:
        mem = _meminfo()
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        return Response(
            [
                {
                    "processors": str(os.cpu_count() or 0),
                    "physical.memory.total": _gib(mem.get("MemTotal")),
                    "physical.memory.free": _gib(mem.get("MemAvailable")),
                    "swap.space.total": _gib(mem.get("SwapTotal")),
                    "swap.space.free": _gib(mem.get("SwapFree")),
                    "load.systemAverage": f"{load:.2f}",
                    "thread.count": str(threading.active_count()),
                }
            ]
        )
