"""Shipping the task groups' log lines (engine.member.tasklogs) into PostgreSQL, so any web
process shows any worker's lines.

A thread of its own flushes the buffer every FLUSH_INTERVAL (and once more as the worker
stops), in one transaction on a session of its own with a statement timeout:
- one INSERT ... SELECT FROM unnest(...) writes the whole batch. It joins each line's task
  group on its id, its attempt and this member, so only lines of attempts this member still
  runs (or ran last) land: a stale attempt's late lines, written after the master moved its
  task group elsewhere, are refused there and then, at no cost beyond the join;
- one statement keeps the newest ``engine.logs.lines-per-task-group`` lines of each task group
  just written, and notifies LOGS_CHANNEL with the jobs written (the dashboard's relay
  re-renders their pages).
A database outage loses nothing the buffer can hold: lines stay until a flush writes them,
and the worker carries on. A batch the database refuses for another reason is given up after
a few tries (counted as dropped), so one bad line cannot stop the shipping for good.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

import psycopg
from celery import signals
from django.conf import settings

from engine.dbsession import connect_dedicated, session_lost
from engine.errortext import first_line
from engine.jobs.tasklog_reading import LOGS_CHANNEL, MAX_LEVEL
from engine.locks import LOG_APPEND
from engine.member.tasklogs import LineBuffer, TaskLogHandler, dropped_lines
from engine.redaction import redact_config

log = logging.getLogger("keel.tasklogs")

FLUSH_INTERVAL = 0.5
#: The longest wait between tries while the database is away.
MAX_BACKOFF = 5.0
STATEMENT_TIMEOUT_MS = 5000
#: Flushes in a row the database may refuse (not an outage) before the batch is given up.
REFUSALS = 3
#: Jobs named in one notification (a payload is at most 8000 bytes).
NOTIFY_JOBS = 200

INSERT = """
WITH written AS (
    INSERT INTO engine_tasklogline (job_id, task_group_id, attempt, at, level, logger, message)
    SELECT tg.job_id, l.task_group_id, l.attempt, to_timestamp(l.created), l.level, l.logger,
           l.message
      FROM unnest(%(groups)s::bigint[], %(attempts)s::int[], %(created)s::float8[],
                  %(levels)s::smallint[], %(loggers)s::text[], %(messages)s::text[])
           WITH ORDINALITY AS l(task_group_id, attempt, created, level, logger, message, n)
      JOIN engine_taskgroup tg
        ON tg.id = l.task_group_id AND tg.attempt = l.attempt AND tg.member_id = %(member)s
     ORDER BY l.n
    RETURNING job_id, task_group_id
)
SELECT job_id, task_group_id, count(*) FROM written GROUP BY job_id, task_group_id
"""

PRUNE_AND_NOTIFY = """
WITH cut AS (
    SELECT g.id AS task_group_id, c.id AS upto
      FROM unnest(%(groups)s::bigint[]) AS g(id)
     CROSS JOIN LATERAL (
           SELECT id FROM engine_tasklogline
            WHERE task_group_id = g.id
            ORDER BY id DESC OFFSET %(keep)s LIMIT 1
     ) AS c
), pruned AS (
    DELETE FROM engine_tasklogline t USING cut
     WHERE t.task_group_id = cut.task_group_id AND t.id <= cut.upto
)
SELECT pg_notify(%(channel)s, %(jobs)s)
"""


def _clean(text: str) -> str:
    """Text PostgreSQL takes: no NUL characters, no lone surrogates."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode(errors="replace").decode()
    return text


def connect() -> psycopg.Connection:
    """The shipper's own session, every statement bounded."""
    conn = connect_dedicated(f"keel:{settings.PROCESS_NAME}:tasklogs")
    conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
    return conn


class TaskLogShipper:
    """Writes ``buffer``'s lines as ``member_id``'s, every ``interval`` seconds."""

    def __init__(
        self,
        member_id: int,
        buffer: LineBuffer,
        keep: int,
        connect: Callable[[], psycopg.Connection] = connect,
        interval: float = FLUSH_INTERVAL,
    ) -> None:
        self.member_id, self.buffer, self.keep = member_id, buffer, keep
        self.connect, self.interval = connect, interval
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()  # one flush at a time (the thread's, the last one)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._refusals = 0
        self._pending = 0  # lines of the batch being written
        self._mark = 0  # the buffer's eviction mark when that batch was peeked
        self._away = False  # the database is unreachable (said once per outage)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="task-logs", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and flush what is left (bounded by the statement timeout)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        # A flush stuck on a dead link does not hold the exit (its session is left to it); a
        # failed one closed its session already.
        if self.flush_safely(wait=timeout):
            self._close()

    def _run(self) -> None:
        delay = self.interval
        while not self._stopping.wait(delay):
            attach()
            delay = self.interval if self.flush_safely() else min(delay * 2, MAX_BACKOFF)

    def flush_safely(self, wait: float = -1) -> bool:
        """A flush that never raises; False when the database did not take the batch (or a
        flush in progress did not end within ``wait`` seconds)."""
        if not self._lock.acquire(timeout=wait):
            return False
        try:
            try:
                self._flush()
            except Exception as exc:
                self._close()
                self._failed(exc)
                return False
            self._refusals = 0
            if self._away:
                self._away = False
                log.info("task log lines are shipped again")
            return True
        finally:
            self._lock.release()

    def flush(self) -> int:
        """Write the buffer's lines now; the number of lines that landed."""
        with self._lock:
            return self._flush()

    def _flush(self) -> int:
        lines, dropped, mark = self.buffer.peek(self.buffer.capacity)
        batch = lines + dropped_lines(dropped)
        self._pending, self._mark = len(lines), mark
        if not batch:
            return 0
        params = {
            "groups": [line.task_group_id for line in batch],
            "attempts": [line.attempt for line in batch],
            "created": [line.created for line in batch],
            "levels": [max(0, min(line.level, MAX_LEVEL)) for line in batch],  # a smallint
            "loggers": [_clean(line.logger) for line in batch],
            # Redacted as stored configs and errors are: a URL's password in a traceback.
            "messages": [_clean(redact_config(line.message)) for line in batch],
            "member": self.member_id,
        }
        if self._conn is None or self._conn.closed:
            self._conn = self.connect()
        with self._conn.transaction():
            # Line ids become visible in order (a client reading ``after=lineId`` never skips
            # a line that commits late), as event seqs do: held from the insert to the commit.
            self._conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", LOG_APPEND)
            written = self._conn.execute(INSERT, params).fetchall()
            if written:
                jobs = sorted({job for job, _, _ in written})[:NOTIFY_JOBS]
                self._conn.execute(
                    PRUNE_AND_NOTIFY,
                    {
                        "groups": sorted({group for _, group, _ in written}),
                        "keep": self.keep,
                        "channel": LOGS_CHANNEL,
                        "jobs": ",".join(map(str, jobs)),
                    },
                )
        self.buffer.consume(lines, dropped, mark)
        return sum(count for _, _, count in written)

    def _failed(self, exc: Exception) -> None:
        if session_lost(exc):
            if not self._away:
                self._away = True
                log.warning(
                    "task log lines wait in memory (at most %s): the database is unreachable (%s)",
                    self.buffer.capacity,
                    first_line(exc),
                )
            return
        self._refusals += 1
        if self._refusals < REFUSALS:
            log.warning("shipping task log lines failed (try %s): %s", self._refusals, exc)
            return
        self._refusals = 0
        self.buffer.discard(self._pending, self._mark)
        log.error("gave up %s task log lines the database refused: %s", self._pending, exc)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        with contextlib.suppress(Exception):  # a session already gone
            if conn is not None:
                conn.close()


_handler: TaskLogHandler | None = None
_shipper: TaskLogShipper | None = None


def attach(**kwargs) -> None:
    """Put the handler on the root logger unless it is there. Celery's worker start runs
    ``django.setup()`` again, whose logging configuration replaces the root's handlers: this
    runs after it (Celery's ``worker_init``), and the shipper checks every flush."""
    handler, root = _handler, logging.getLogger()
    if handler is not None and handler not in root.handlers:
        root.addHandler(handler)


def install(member_id: int) -> TaskLogShipper:
    """Capture task groups' log lines in this process and ship them as ``member_id``'s."""
    global _handler, _shipper
    shutdown()
    buffer = LineBuffer()
    _handler = TaskLogHandler(buffer)
    _shipper = TaskLogShipper(member_id, buffer, settings.ENGINE["logs.lines-per-task-group"])
    attach()
    signals.worker_init.connect(attach, weak=False, dispatch_uid="keel-task-logs")
    _shipper.start()
    return _shipper


def ship_now(wait: float = 2.0) -> bool:
    """Ship the lines captured so far, at once: a task group does before it reports its end
    (or its graceful close), so its last lines land while the attempt is still the task
    group's. The master may move it at once, and a moved attempt's late lines are refused.
    Waits at most ``wait`` s for a flush in progress; False if none is installed or the
    database did not take the lines (they stay for the shipper's next flush)."""
    shipper = _shipper
    return shipper is not None and shipper.flush_safely(wait=wait)


def shutdown() -> None:
    """Stop capturing, and ship what is left (the worker is stopping)."""
    global _handler, _shipper
    handler, shipper, _handler, _shipper = _handler, _shipper, None, None
    if handler is not None:
        logging.getLogger().removeHandler(handler)
    if shipper is not None:
        shipper.stop()
