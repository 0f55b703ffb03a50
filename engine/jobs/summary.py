"""A job's pipelines, task groups, metrics and checkpoints as the API shows them: read live
while the job runs, and kept in its history when it ends, so its detail reads the same after
its running state is cleaned up (engine.jobs.cleanup)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import CharField, FloatField, OuterRef, Prefetch, Subquery, Sum
from django.db.models.functions import Cast, Coalesce

from engine import counters
from engine.models import Checkpoint, Job, MetricTotal, TaskGroup
from engine.sourceruntime import SourceRuntime
from engine.states import CheckpointState, ExecutionStatus


def retired(name: str) -> Coalesce:
    """The outer job's total ``name`` (a counters.PER_JOB total, labelled by job id) summed
    over its shards, 0 without any: a subquery on the totals' unique index."""
    totals = (
        MetricTotal.objects.filter(name=name, label=Cast(OuterRef("id"), CharField()))
        .order_by()
        .values("name")
        .annotate(total=Sum("value"))
        .values("total")
    )
    return Coalesce(Subquery(totals), 0.0, output_field=FloatField())


def with_retired(queryset):
    """Jobs with the rows of the attempts their restores replaced (``retired_read``,
    ``retired_written``): a redeploy starts a task group's counts over, and the scheduler
    keeps the replaced ones in the job's totals (engine.jobs.scheduler.deploy_on). Read in
    the jobs' own query, so a list of jobs costs no query more."""
    return queryset.annotate(
        retired_read=retired(counters.JOB_ROWS_READ_RETIRED),
        retired_written=retired(counters.JOB_ROWS_WRITTEN_RETIRED),
    )


def with_groups(queryset):
    """Jobs with their pipelines and task groups (members and slots) prefetched, and the rows
    of their replaced attempts (``with_retired``)."""
    groups = TaskGroup.objects.select_related("member", "last_slot").order_by("kind", "index")
    return with_retired(queryset).prefetch_related(
        Prefetch("pipelines__task_groups", queryset=groups)
    )


def group_metrics(group: TaskGroup) -> dict:
    """A task group's counts, rate and back-pressure: the seconds its reader spent blocked in
    its sinks' writes, and their share of its busy seconds (0 to 1; 0 before it has any)."""
    busy, blocked = group.busy_seconds, group.blocked_seconds
    return {
        "sourceReceivedCount": group.source_received,
        "sinkWriteCount": group.sink_written,
        "sourceReceivedBytes": group.source_received_bytes,
        "sinkWriteBytes": group.sink_written_bytes,
        "rowsPerSecond": round(group.rows_per_second, 1),
        "blockedSeconds": round(blocked, 3),
        "backPressureRatio": round(min(max(blocked / busy, 0.0), 1.0), 3) if busy > 0 else 0.0,
    }


def _group(group: TaskGroup) -> dict:
    return {
        "taskGroupId": group.id,
        "kind": group.kind,
        "index": group.index,
        "status": group.status,
        "attempt": group.attempt,
        "member": (
            {"uuid": str(group.member.uuid), "name": group.member.name} if group.member else None
        ),
        # Where it runs, or ran last once it ended (an ended task group holds no slot).
        "slot": (
            {"id": group.last_slot.id, "sequence": group.last_slot.sequence}
            if group.last_slot
            else None
        ),
        "errorMsg": group.error_msg,
        "metrics": group_metrics(group),
        # Lane A: the task group's runtime metrics as last reported (null in Lane B).
        "sourceRuntime": group.source_runtime,
    }


def pipelines(job: Job) -> list[dict]:
    return [
        {
            "pipelineId": pipeline.index,
            "status": pipeline.status,
            "restoreCount": pipeline.restore_count,
            "errorMsg": pipeline.error_msg,
            "parallelism": (pipeline.plan or {}).get("parallelism", 1),  # a rescale's, once run
            # The lane recorded when the job was planned (a plan from before lanes: B).
            "sourceRuntime": SourceRuntime.from_json(
                (pipeline.plan or {}).get("sourceRuntime")
            ).to_json(),
            "taskGroups": [_group(g) for g in pipeline.task_groups.all()],
        }
        for pipeline in job.pipelines.all()
    ]


def metrics(job: Job) -> dict:
    """The job's counts over every attempt: its live task groups' plus the rows of the
    attempts its restores replaced (read with the job by ``with_groups``; one query here for a
    job read without), so they never fall after a restore. Bytes are the live attempts' only:
    no per-job total of replaced attempts' bytes is kept."""
    groups = [g for p in job.pipelines.all() for g in p.task_groups.all()]
    if not hasattr(job, "retired_read"):
        job = with_retired(Job.objects.filter(id=job.id)).only("id").get()
    return {
        "sourceReceivedCount": round(job.retired_read) + sum(g.source_received for g in groups),
        "sinkWriteCount": round(job.retired_written) + sum(g.sink_written for g in groups),
        "sourceReceivedBytes": sum(g.source_received_bytes for g in groups),
        "sinkWriteBytes": sum(g.sink_written_bytes for g in groups),
        "rowsPerSecond": round(
            sum(g.rows_per_second for g in groups if g.status == ExecutionStatus.RUNNING), 1
        ),
    }


def checkpoints(job: Job) -> dict:
    latest = (
        Checkpoint.objects.filter(job=job, state=CheckpointState.COMPLETED)
        .order_by("-id")
        .values("id", "ended_at")
        .first()
    )
    return {
        "completed": sum(p.checkpoints_completed for p in job.pipelines.all()),
        "failed": sum(p.checkpoints_failed for p in job.pipelines.all()),
        "latestId": latest["id"] if latest else None,
        "latestAt": _iso(latest["ended_at"]) if latest else None,
    }


def _iso(value) -> str | None:
    """As the API's JSON renders a datetime (UTC as ``Z``)."""
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def snapshot(job: Job) -> dict:
    """What the history keeps of the job's running state, in the API's shape."""
    job = with_groups(Job.objects.filter(id=job.id)).get()
    return {
        "pipelines": pipelines(job),
        "metrics": metrics(job),
        "checkpoints": checkpoints(job),
        "dag": dag(job),
    }


def dag(job: Job) -> dict:
    """The job's plugins as a graph (dag_of its pipelines' plans)."""
    return dag_of((pipeline.index, pipeline.plan) for pipeline in job.pipelines.all())


def dag_of(plans: Iterable[tuple[int, dict]]) -> dict:
    """Plans, each with its pipeline's index, as a graph: vertices numbered across the job
    (each pipeline's source, transforms, then sinks) and, per pipeline, its edges as (from, to)
    vertex ids."""
    vertices: list[dict] = []
    edges: dict[str, list[list[int]]] = {}
    for index, plan in plans:
        ids: dict[str, int] = {}
        for kind, nodes in (
            ("source", [plan["source"]]),
            ("transform", plan["transforms"]),
            ("sink", plan["sinks"]),
        ):
            for node in nodes:
                ids[node["key"]] = len(vertices) + 1
                vertices.append(
                    {
                        "id": ids[node["key"]],
                        "type": kind,
                        "path": node["path"],
                        "plugin": node["plugin"],
                    }
                )
        edges[str(index)] = [
            [ids[node["input"]], ids[node["key"]]]
            for node in [*plan["transforms"], *plan["sinks"]]
            if node.get("input") in ids
        ]
    return {"vertices": vertices, "edges": edges}


def history_part(job: Job, epoch: int | None):
    """The job's part of its finished-job record: its snapshot, its error and timings."""
    from history.contributions import HistoryPart

    return HistoryPart(fields={"summary": snapshot(job), "error_msg": job.error_msg})


def history_failed(job: Job, epoch: int | None, exc: Exception) -> list:
    return []  # the running state stays until the record is written (the cleanup waits)


def pending_history() -> list[int]:
    return []  # the dirty-job contributor names the jobs whose record is missing
