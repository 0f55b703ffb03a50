"""Throughput samples of running jobs (the dashboard's sparklines and live rows/s): one
statement samples every running job, one deletes what is older than the window, and a
notification tells the web process's relay (no event: samples are not state changes)."""

from __future__ import annotations

from django.db import connection

from engine.fencing import fenced
from engine.states import ExecutionStatus, JobStatus

#: The dashboard draws this much history.
WINDOW_SECONDS = 600
#: The LISTEN/NOTIFY channel the relay hears sampling on.
SAMPLES_CHANNEL = "keel_samples"


def sample(epoch: int) -> bool:
    """Active-master step: a sample per running job; True if any job was sampled."""
    with fenced(epoch), connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO engine_throughputsample (job_id, at, rows_per_second)
            SELECT t.job_id, now(), coalesce(sum(t.rows_per_second), 0)
              FROM engine_taskgroup t JOIN engine_job j ON j.id = t.job_id
             WHERE j.status = %s AND t.status = %s
             GROUP BY t.job_id
            """,
            [JobStatus.RUNNING, ExecutionStatus.RUNNING],
        )
        sampled = cur.rowcount
        cur.execute(
            "DELETE FROM engine_throughputsample WHERE at < now() - make_interval(secs => %s)",
            [WINDOW_SECONDS],
        )
        if sampled:
            cur.execute("SELECT pg_notify(%s, '')", [SAMPLES_CHANNEL])
    return False  # sampling is periodic housekeeping, never a reason to run again at once


def recent(job_id: int, limit: int = 120) -> list[float]:
    """The job's last samples, oldest first."""
    from engine.models import ThroughputSample

    values = list(
        ThroughputSample.objects.filter(job_id=job_id)
        .order_by("-at")
        .values_list("rows_per_second", flat=True)[:limit]
    )
    return values[::-1]


def sparkline(values: list[float], width: int = 240, height: int = 36) -> str:
    """An SVG polyline's points for ``values`` (empty for fewer than two)."""
    if len(values) < 2:
        return ""
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{height - (v / top) * (height - 2) - 1:.1f}" for i, v in enumerate(values)
    )
