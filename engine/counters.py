"""Raising the engine's monotonic totals (MetricTotal), inside the transaction of what they
count: a rolled-back change counts nothing, a committed one exactly once.

One statement per call whatever the number of totals, rows taken in one order (name, label) so
two transactions never deadlock on them, on a shard picked by the database session, so that
concurrent writers do not queue on one row. (It was picked per process: a worker's pool
threads running a storm's restores, and its task groups reporting RUNNING, each waited for the
one before to commit, and that commit waited for the event-append lock.)
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

#: Names of the totals (Prometheus names are built from them by engine.metrics).
CHECKPOINTS = "checkpoints"  # label: completed | failed
CHECKPOINT_SECONDS = "checkpoint_seconds"  # label: the bucket's upper bound; "sum"
RESTORES = "restores"  # label: member_loss | planned
RECOVERY_ATTEMPTS = "recovery_attempts"
DIRTY_TRANSITIONS = "dirty_transitions"
ROWS_RETIRED = "rows_retired"  # label: read | written
BYTES_RETIRED = "bytes_retired"  # label: read | written (Arrow bytes, as rows_retired)
JOBS_ENDED = "jobs_ended"  # label: the terminal status (FINISHED, FAILED, CANCELED)
#: Per job (label: the job id), the rows of its replaced attempts: a running job's counters add
#: them to its live task groups' counts, so they do not fall when a restore starts those over.
#: Removed with the job's running state (engine.jobs.cleanup); only running jobs are exported.
JOB_ROWS_READ_RETIRED = "job_rows_read_retired"
JOB_ROWS_WRITTEN_RETIRED = "job_rows_written_retired"
PER_JOB = (JOB_ROWS_READ_RETIRED, JOB_ROWS_WRITTEN_RETIRED)

#: Upper bounds of the checkpoint-duration histogram's buckets, in seconds.
CHECKPOINT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
SHARDS = 16


def bump(items: Iterable[tuple[str, str, float]]) -> None:
    """Add each ``(name, label, amount)`` to its total (zero amounts are skipped; the amounts
    of one total given several times are added first: a statement may touch a row once)."""
    summed: dict[tuple[str, str], float] = {}
    for name, label, amount in items:
        if amount:
            summed[(name, label)] = summed.get((name, label), 0.0) + float(amount)
    rows = sorted((name, label, amount) for (name, label), amount in summed.items() if amount)
    if not rows:
        return
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO engine_metrictotal (name, label, shard, value)
            SELECT n, l, pg_backend_pid() %% %s, v
              FROM unnest(%s::text[], %s::text[], %s::float8[]) AS t(n, l, v)
             ORDER BY n, l
            ON CONFLICT (name, label, shard)
            DO UPDATE SET value = engine_metrictotal.value + EXCLUDED.value
            """,
            [
                SHARDS,
                [r[0] for r in rows],
                [r[1] for r in rows],
                [r[2] for r in rows],
            ],
        )


def checkpoint_ended(completed: bool, seconds: float | None) -> None:
    checkpoints_ended([(completed, seconds)])


def checkpoints_ended(outcomes: Iterable[tuple[bool, float | None]]) -> None:
    """Count checkpoints that ended (completed or not; a completed one's duration), in one
    statement for any number of them."""
    totals: dict[tuple[str, str], float] = {}

    def add(name: str, label: str, amount: float) -> None:
        totals[(name, label)] = totals.get((name, label), 0.0) + amount

    for completed, seconds in outcomes:
        add(CHECKPOINTS, "completed" if completed else "failed", 1)
        if completed and seconds is not None:
            bucket = next((str(b) for b in CHECKPOINT_BUCKETS if seconds <= b), "+Inf")
            add(CHECKPOINT_SECONDS, bucket, 1)
            add(CHECKPOINT_SECONDS, "sum", max(seconds, 0))
    bump((name, label, amount) for (name, label), amount in totals.items())
