"""A job's exception history: one row for each task group attempt that ended FAILED, with its
worker's error and traceback, or the member whose loss failed it. Like Flink's exception
history, the newest RETAINED are kept per job, and a failure that made the master restore its
pipeline says so (an operator tells a recovered failure from the one that ended the job)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from engine.models import JobException
from engine.redaction import redact_config

#: Failures kept per job (Flink's ``web.exception-history-size`` default).
RETAINED = 16
#: A traceback is kept to its last this many characters (its innermost frames and the error).
TRACEBACK_LIMIT = 16 * 1024
#: An error message is kept to this many characters (as a task group's ``error_msg``).
ERROR_LIMIT = 4000


@dataclass(frozen=True)
class Failure:
    """A task group attempt that ended FAILED, as its ending transaction saw it."""

    job_id: int
    task_group_id: int
    attempt: int
    #: The worker that ran it (for a member loss, the lost member).
    member_id: int | None
    #: Redacted already (the task group's ``error_msg`` and event keep the same text).
    error: str
    traceback: str = ""
    member_lost: bool = False


def redact(text: str) -> str:
    """An error or traceback as it may be kept and shown: secrets in it (a URL's password, a
    ``password = ...`` in a quoted config line) replaced as in a stored config, and no NUL
    (PostgreSQL text holds none)."""
    return redact_config(text).replace("\x00", "") if text else ""


def last_part(text: str, limit: int = TRACEBACK_LIMIT) -> str:
    """At most ``limit`` characters of ``text``, its end kept: a traceback's last frames and
    its error are what says why."""
    return text if len(text) <= limit else "...\n" + text[-(limit - 4) :]


#: The failures, each with its pipeline and member name of now, in the order given.
_INSERT = """
INSERT INTO engine_jobexception (job_id, at, task_group_id, task_group_label, pipeline_index,
                                 attempt, member_id, member_name, error, traceback, member_lost,
                                 caused_restore)
SELECT f.job, statement_timestamp(), f.task_group, coalesce(lower(t.kind) || ' ' || t.index, ''),
       p.index, f.attempt, m.id, coalesce(m.name, ''), f.error, f.traceback, f.lost, false
  FROM unnest(%s::bigint[], %s::bigint[], %s::int[], %s::bigint[], %s::text[], %s::text[],
              %s::bool[]) WITH ORDINALITY AS f(job, task_group, attempt, member, error, traceback,
                                               lost, n)
  LEFT JOIN engine_taskgroup t ON t.id = f.task_group
  LEFT JOIN engine_pipeline p ON p.id = t.pipeline_id
  LEFT JOIN engine_member m ON m.id = f.member
 ORDER BY f.n
"""

#: Every failure of these jobs but the newest RETAINED of each.
_PRUNE = """
DELETE FROM engine_jobexception e
 USING (SELECT id, row_number() OVER (PARTITION BY job_id ORDER BY id DESC) AS n
          FROM engine_jobexception WHERE job_id = ANY(%s::bigint[])) r
 WHERE e.id = r.id AND r.n > %s
"""


def record(failures: list[Failure]) -> None:
    """Keep these failures (in the caller's transaction), then only the newest RETAINED of
    each job touched: two statements however many task groups ended together."""
    if not failures:
        return
    columns = (
        [f.job_id for f in failures],
        [f.task_group_id for f in failures],
        [f.attempt for f in failures],
        [f.member_id for f in failures],
        [f.error[:ERROR_LIMIT] for f in failures],
        [last_part(redact(f.traceback)) for f in failures],
        [f.member_lost for f in failures],
    )
    with connection.cursor() as cur:
        cur.execute(_INSERT, columns)
        cur.execute(_PRUNE, [sorted({f.job_id for f in failures}), RETAINED])


def mark_restored(job_id: int, attempts: list[tuple[int, int]]) -> None:
    """These failed attempts (task group id, attempt) of the job made the master restore their
    pipeline: one statement."""
    if not attempts:
        return
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE engine_jobexception e SET caused_restore = true
              FROM unnest(%s::bigint[], %s::int[]) AS a(task_group, attempt)
             WHERE e.job_id = %s AND e.task_group_id = a.task_group AND e.attempt = a.attempt
            """,
            [[tg for tg, _ in attempts], [at for _, at in attempts], job_id],
        )


def recent(job_id: int, limit: int = RETAINED) -> list[dict]:
    """The job's failures, newest first, as the API answers them
    (``GET /api/v1/jobs/<id>/exceptions``): one query."""
    rows = (
        JobException.objects.filter(job_id=job_id)
        .select_related("member")
        .only(
            "id",
            "at",
            "pipeline_index",
            "task_group_id",
            "task_group_label",
            "attempt",
            "member_name",
            "error",
            "traceback",
            "member_lost",
            "caused_restore",
            "member__uuid",
            "member__name",
        )
        .order_by("-id")[:limit]
    )
    return [_as_dict(row) for row in rows]


def _as_dict(row: JobException) -> dict:
    member = row.member
    return {
        "exceptionId": row.id,
        "at": row.at,
        "pipelineId": row.pipeline_index,
        "taskGroupId": row.task_group_id,
        "taskGroup": row.task_group_label or None,
        "attempt": row.attempt,
        "member": {"uuid": str(member.uuid), "name": member.name} if member else None,
        "memberName": row.member_name,
        "error": row.error,
        "traceback": row.traceback,
        "memberLost": row.member_lost,
        "causedRestore": row.caused_restore,
    }
