"""The rolling-upgrade rule on the cluster's side: while a job that tracks its recovery runs, a
process of a protocol older than dirty-job tracking needs may neither join as a member nor
campaign as a master, since it could not take part in the tracking (docs/decisions/0007). Both
check under the gate a tracked job's submission takes, so of the two one always sees the other
(engine.locks)."""

from __future__ import annotations

from engine.locks import DIRTY_VERSION_GATE
from engine.protocol import DIRTY_TRACKING_SINCE, WRITER_UUID_SINCE
from engine.states import JOB_TERMINAL


def tracking_refusal(cur, who: str, protocol_version: int, action: str, upgrade: str) -> str:
    """Inside the caller's transaction, under the gate: why ``who`` (``member NAME`` or
    ``master NAME``) may not ``action`` now, or ``""`` if it may. ``cur``: a DB-API cursor
    (psycopg's or Django's); ``upgrade``: what to upgrade (``worker``, ``master``)."""
    if protocol_version >= DIRTY_TRACKING_SINCE:
        return ""
    running = _running_jobs(cur, "dirty_threshold > 0")
    if not running:
        return ""
    return (
        f"{who} runs protocol {protocol_version} and cannot {action} while jobs that track "
        f"their recovery run (jobs {running}): they need protocol {DIRTY_TRACKING_SINCE} on "
        f"every member; upgrade this {upgrade}"
    )


def writer_refusal(cur, who: str, protocol_version: int) -> str:
    """Inside the caller's transaction, under the gate: why member ``who`` may not join now
    (``""`` if it may): a member older than WRITER_UUID_SINCE names a job's sink writers after
    its id, so it may not join while a job whose writers are named after its uuid runs."""
    if protocol_version >= WRITER_UUID_SINCE:
        return ""
    running = _running_jobs(cur, "uuid IS NOT NULL")
    if not running:
        return ""
    return (
        f"{who} runs protocol {protocol_version} and cannot join while jobs whose sinks name "
        f"their writers after the job's uuid run (jobs {running}): they need protocol "
        f"{WRITER_UUID_SINCE} on every member; upgrade this worker"
    )


def _running_jobs(cur, condition: str) -> str:
    """Under the gate (taken here): up to five unfinished jobs matching ``condition`` (a
    constant of this module), listed for a message; "" for none."""
    cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", DIRTY_VERSION_GATE)
    cur.execute(
        f"SELECT id FROM engine_job WHERE {condition} AND status <> ALL(%s) ORDER BY id LIMIT 5",
        (sorted(JOB_TERMINAL),),
    )
    return ", ".join(str(row[0]) for row in cur.fetchall())
