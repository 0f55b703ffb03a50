"""The Prometheus exposition (``GET /metrics``): read from PostgreSQL at each scrape, so every
web process answers the same and a scrape sees the cluster, not one process.

Gauges are counted from the live rows; counters are monotonic by construction: the member-event
sequence and the master epoch only rise, and the rest are MetricTotal rows raised in the
transaction of what they count (engine.counters), plus, for rows and bytes read and written,
the live task groups' counts (an attempt's counts move into the totals when it is replaced or
cleaned up). Labels are bounded: states and kinds, and job ids only for the jobs that hold slots
(as many as the slots allow), whose series leave when the job ends.

Jobs ended are counted by their terminal transition (``keel_jobs_ended_total``), so the counter
keeps them after retention deletes the rows that ``keel_jobs`` counts. While PostgreSQL cannot
be reached the exposition is ``keel_database_up 0`` alone, still answered with a 200: a failed
scrape would read as the web process being down (docs/decisions/0036-database-down-metrics.md).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from django.db import DatabaseError, connection
from django.db.models import Count, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from engine import counters, dirty
from engine.dbsession import session_lost
from engine.errortext import first_line
from engine.jobs import cleanup
from engine.models import (
    ClusterState,
    Job,
    JobCleanupRecord,
    MasterLease,
    Member,
    MemberDrain,
    MetricTotal,
    Pipeline,
    Slot,
    TaskGroup,
)
from engine.states import (
    JOB_TERMINAL,
    CleanupKind,
    CleanupState,
    DirtyEvaluation,
    DrainState,
    ExecutionStatus,
    JobStatus,
    MemberState,
    SlotState,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
log = logging.getLogger("keel.metrics")

#: The jobs that hold slots: theirs are the per-job series (a job's leave when it ends).
HOLDING_SLOTS = (JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.FAILING, JobStatus.CANCELING)


def _totals() -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = defaultdict(float)
    for name, label, value in (
        MetricTotal.objects.values("name", "label")
        .annotate(v=Sum("value"))
        .values_list("name", "label", "v")
    ):
        out[(name, label)] = value or 0.0
    return out


def _by(queryset, field: str, values) -> dict[str, int]:
    counts = dict.fromkeys(values, 0)
    for key, n in queryset.order_by().values_list(field).annotate(n=Count("pk")):
        counts[key] = n
    return counts


#: What sources read and sinks wrote, counted in rows and in Arrow bytes: (family name, help,
#: its retired total's name, the task group field of the live count).
_MOVED = (
    ("keel_rows_read", "Rows read by sources.", counters.ROWS_RETIRED, "read", "source_received"),
    (
        "keel_rows_written",
        "Rows written by sinks.",
        counters.ROWS_RETIRED,
        "written",
        "sink_written",
    ),
    (
        "keel_bytes_read",
        "Bytes read by sources (the Arrow size of the batches they made).",
        counters.BYTES_RETIRED,
        "read",
        "source_received_bytes",
    ),
    (
        "keel_bytes_written",
        "Bytes written by sinks (the Arrow size of the batches they took).",
        counters.BYTES_RETIRED,
        "written",
        "sink_written_bytes",
    ),
)


def _moved(totals: dict[tuple[str, str], float]):
    """The read and written counters: each the retired attempts' total plus what the task
    groups still hold (one aggregate for all four)."""
    live = TaskGroup.objects.aggregate(**{name: Sum(field) for name, *_, field in _MOVED})
    for name, doc, total, label, _ in _MOVED:
        yield CounterMetricFamily(name, doc, value=totals[(total, label)] + (live[name] or 0))


def _family(kind, name: str, doc: str, label: str, values: dict[str, float]):
    """A family with one label, a sample per value (every known value, zeros included)."""
    family = kind(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def _per_job(totals: dict[tuple[str, str], float]):
    """The series of each job that holds slots, labelled ``job_id``, in four queries whatever
    the number of jobs. Rows count every attempt: the live task groups' counts plus the job's
    retired ones (a restore starts an attempt's counts over; counters.PER_JOB)."""
    live = Job.objects.filter(status__in=HOLDING_SLOTS)
    jobs = list(dirty.annotate(live).order_by("id").values_list("id", "dirty_evaluation"))
    rows = {
        job: (read or 0, written or 0)
        for job, read, written in TaskGroup.objects.filter(job__in=live)
        .order_by()
        .values_list("job_id")
        .annotate(Sum("source_received"), Sum("sink_written"))
    }
    pipelines = {
        job: (completed or 0, failed or 0, restores or 0)
        for job, completed, failed, restores in Pipeline.objects.filter(job__in=live)
        .order_by()
        .values_list("job_id")
        .annotate(Sum("checkpoints_completed"), Sum("checkpoints_failed"), Sum("restore_count"))
    }
    read = CounterMetricFamily(
        "keel_job_rows_read", "Rows read by a running job's sources.", labels=["job_id"]
    )
    written = CounterMetricFamily(
        "keel_job_rows_written", "Rows written by a running job's sinks.", labels=["job_id"]
    )
    checkpoints = CounterMetricFamily(
        "keel_job_checkpoints",
        "A running job's checkpoints ended, by state.",
        labels=["job_id", "state"],
    )
    restores = CounterMetricFamily(
        "keel_job_restores", "A running job's pipeline restores.", labels=["job_id"]
    )
    dirty_now = GaugeMetricFamily(
        "keel_job_dirty",
        "1 while a running job's recovery evaluation reads DIRTY, else 0.",
        labels=["job_id"],
    )
    for job_id, evaluation in jobs:
        label = str(job_id)
        live_read, live_written = rows.get(job_id, (0, 0))
        completed, failed, restore_count = pipelines.get(job_id, (0, 0, 0))
        read.add_metric([label], live_read + totals[(counters.JOB_ROWS_READ_RETIRED, label)])
        written.add_metric(
            [label], live_written + totals[(counters.JOB_ROWS_WRITTEN_RETIRED, label)]
        )
        checkpoints.add_metric([label, "completed"], completed)
        checkpoints.add_metric([label, "failed"], failed)
        restores.add_metric([label], restore_count)
        dirty_now.add_metric([label], int(evaluation == DirtyEvaluation.DIRTY))
    return [read, written, checkpoints, restores, dirty_now]


def _database_up(up: bool) -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "keel_database_up",
        "1 when this scrape read PostgreSQL; 0 when it could not reach it (nothing else then).",
        value=int(up),
    )


class EngineCollector:
    """Every family of the exposition, read in one transaction (a consistent snapshot); only
    ``keel_database_up 0`` when the database cannot be reached."""

    def collect(self):
        from django.db import transaction

        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                families = list(self._families())
        except DatabaseError as exc:
            if not session_lost(exc):
                raise
            log.warning("metrics: the database cannot be reached: %s", first_line(exc))
            yield _database_up(False)
            return
        yield _database_up(True)
        yield from families

    def _families(self):
        totals = _totals()
        yield _family(
            GaugeMetricFamily,
            "keel_jobs",
            "Jobs by status (the rows kept: ended ones fall with retention; rates: "
            "keel_jobs_ended_total).",
            "status",
            _by(Job.objects.all(), "status", JobStatus.values),
        )

        evaluations = _by(
            dirty.annotate(Job.objects.filter(dirty_threshold__gt=0)),
            "dirty_evaluation",
            [e for e in DirtyEvaluation.values if e != DirtyEvaluation.DISABLED],
        )
        yield _family(
            GaugeMetricFamily,
            "keel_dirty_jobs",
            "Jobs that track their recovery, by evaluation status (finished ones included).",
            "evaluation",
            evaluations,
        )

        running = GaugeMetricFamily(
            "keel_job_evaluation",
            "1 per running job that tracks its recovery, labelled with its evaluation status.",
            labels=["job_id", "evaluation"],
        )
        for job_id, evaluation in (
            dirty.annotate(
                Job.objects.filter(dirty_threshold__gt=0).exclude(status__in=JOB_TERMINAL)
            )
            .order_by("id")
            .values_list("id", "dirty_evaluation")
        ):
            running.add_metric([str(job_id), evaluation], 1)
        yield running

        yield from _per_job(totals)
        yield _family(
            CounterMetricFamily,
            "keel_jobs_ended",
            "Jobs ended, by terminal status (counted at the transition; never falls when "
            "retention deletes jobs, unlike keel_jobs).",
            "status",
            {str(s): totals[(counters.JOBS_ENDED, str(s))] for s in sorted(JOB_TERMINAL)},
        )

        yield GaugeMetricFamily(
            "keel_task_groups_running",
            "Task groups RUNNING on a member.",
            value=TaskGroup.objects.filter(status=ExecutionStatus.RUNNING).count(),
        )
        slots = Slot.objects.filter(member__state=MemberState.ALIVE)
        yield GaugeMetricFamily("keel_slots", "Slots of ALIVE members.", value=slots.count())
        yield GaugeMetricFamily(
            "keel_slots_assigned",
            "Slots of ALIVE members holding a task group.",
            value=slots.filter(state=SlotState.ASSIGNED).count(),
        )
        yield _family(
            GaugeMetricFamily,
            "keel_members",
            "Members by state.",
            "state",
            _by(Member.objects.all(), "state", MemberState.values),
        )
        yield _family(
            GaugeMetricFamily,
            "keel_drains",
            "Member drains by state.",
            "state",
            _by(MemberDrain.objects.all(), "state", DrainState.values),
        )

        cluster = ClusterState.objects.filter(id=1).first()
        yield CounterMetricFamily(
            "keel_member_events",
            "Member events (a member REMOVED or LEFT): the cluster's member-event sequence.",
            value=cluster.member_event_sequence if cluster else 0,
        )
        lease = MasterLease.objects.filter(id=1).first()
        epoch = lease.epoch if lease else 0
        yield GaugeMetricFamily(
            "keel_master_epoch", "The fencing epoch of the active master.", epoch
        )
        yield CounterMetricFamily(
            "keel_master_elections", "Master elections (each raises the epoch by one).", epoch
        )
        yield GaugeMetricFamily(
            "keel_master_active",
            "1 while a master holds an unexpired lease.",
            value=int(bool(lease and lease.expires_at and lease.expires_at > timezone.now())),
        )

        yield _family(
            CounterMetricFamily,
            "keel_checkpoints",
            "Checkpoints ended, by result.",
            "result",
            {r: totals[(counters.CHECKPOINTS, r)] for r in ("completed", "failed")},
        )
        buckets, running_count = [], 0.0
        for bound in counters.CHECKPOINT_BUCKETS:
            running_count += totals[(counters.CHECKPOINT_SECONDS, str(bound))]
            buckets.append((str(bound), running_count))
        running_count += totals[(counters.CHECKPOINT_SECONDS, "+Inf")]
        buckets.append(("+Inf", running_count))
        yield HistogramMetricFamily(
            "keel_checkpoint_duration_seconds",
            "From trigger to completion, of completed checkpoints.",
            buckets=buckets,
            sum_value=totals[(counters.CHECKPOINT_SECONDS, "sum")],
        )
        yield _family(
            CounterMetricFamily,
            "keel_restores",
            "Pipeline restores, by cause.",
            "cause",
            {c: totals[(counters.RESTORES, c)] for c in ("member_loss", "planned")},
        )

        yield from _moved(totals)
        yield CounterMetricFamily(
            "keel_dirty_transitions",
            "Jobs that turned DIRTY.",
            value=totals[(counters.DIRTY_TRANSITIONS, "")],
        )
        yield CounterMetricFamily(
            "keel_recovery_attempts",
            "Recovery attempts counted toward job.dirty-task.threshold (member loss).",
            value=totals[(counters.RECOVERY_ATTEMPTS, "")],
        )

        records = GaugeMetricFamily(
            "keel_cleanup_records", "Cleanup records by kind and state.", labels=["kind", "state"]
        )
        found = {
            (kind, state): n
            for kind, state, n in JobCleanupRecord.objects.order_by()
            .values_list("kind", "state")
            .annotate(n=Count("pk"))
        }
        for kind in CleanupKind.values:
            for state in CleanupState.values:
                records.add_metric([kind, state], found.get((kind, state), 0))
        yield records
        yield GaugeMetricFamily(
            "keel_cleanup_records_overdue",
            "Open cleanup records past their due time (as the admin console counts them).",
            value=cleanup.overdue_count(),
        )


def exposition() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector())
    return generate_latest(registry)
