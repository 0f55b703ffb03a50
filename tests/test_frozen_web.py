"""A frozen web process does not stall the engine: PostgreSQL ends its open transaction (with
the event-append lock it holds) after the engine's idle-in-transaction timeout."""

from __future__ import annotations

import signal
import threading

import psycopg
import pytest

from engine.locks import EVENT_APPEND
from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import post, submit

pytestmark = pytest.mark.cluster

STREAMING = """
env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 200 }
source { FakeSource { rows.per-second = 100, endless = true } }
sink { Blackhole { } }
"""


def test_a_web_process_frozen_inside_a_submit_stalls_nothing(db_template):
    with Cluster(db_template, masters=1, workers=1, slots=4) as c:
        job_id = submit(c, STREAMING)

        wait_for(
            lambda: c.checkpoints_completed(job_id) >= 2, 30, interval=0.05, what="checkpoints"
        )

        def submit_waiting_for_the_append_lock() -> int | None:
            """The backend pid of the web session waiting for the event-append lock."""
            return c.one(
                "SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid"
                " WHERE a.application_name LIKE 'keel:web:%%' AND l.locktype = 'advisory'"
                " AND a.datname = current_database()"
                " AND NOT l.granted AND (l.classid, l.objid) = (%s, %s)",
                EVENT_APPEND,
            )

        def holds_the_append_lock(backend: int) -> bool:
            return c.one(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory'"
                " AND granted AND (classid, objid) = (%s, %s)",
                (backend, *EVENT_APPEND),
            )

        def alive(backend: int) -> bool:
            # The session's start time too: on a machine that spawns processes all day (a
            # 32768 pid space), the pid alone could name a later session.
            return c.one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND backend_start = %s",
                (backend, started),
            )

        def session_seen(backend: int) -> tuple | None:
            return c.db.execute(
                "SELECT state, wait_event_type, wait_event, now() - state_change, query"
                " FROM pg_stat_activity WHERE pid = %s",
                (backend,),
            ).fetchone()

        # Hold the event-append lock until the web's submit waits for it, freeze the web
        # process, then let go: its session takes the lock, and its process never commits.
        with psycopg.connect(c.database_url) as holder:
            holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", EVENT_APPEND)
            answers: list[int] = []
            bodies: list = []

            def send() -> None:
                code, body = post(c, "/api/v1/jobs", {"config": STREAMING})
                answers.append(code)
                bodies.append(body)

            request = threading.Thread(target=send, daemon=True)
            request.start()
            backend = wait_for(
                submit_waiting_for_the_append_lock, 10, what="the submit to wait for the lock"
            )
            started = c.one("SELECT backend_start FROM pg_stat_activity WHERE pid = %s", (backend,))
            c.signal("web", signal.SIGSTOP)
        try:
            # The frozen process's session is granted the lock (it was queued for it), and
            # PostgreSQL ends that session once it has been idle in its transaction too long.
            wait_for(
                lambda: holds_the_append_lock(backend) or not alive(backend),
                10,
                interval=0.01,
                what="the frozen web's session to take the lock",
            )
            before = c.checkpoints_completed(job_id)
            wait_for(
                lambda: c.checkpoints_completed(job_id) >= before + 3,
                10,
                interval=0.05,
                what="checkpoints again",
            )
            # The lock is released as the session aborts, a moment before its backend leaves
            # pg_stat_activity (a loaded machine widens that moment): wait for it to go.
            # The deadline is generous: the moment is short, but CI's machine runs other
            # clusters beside this one. What the session was doing is in the message.
            try:
                wait_for(
                    lambda: not alive(backend),
                    30,
                    interval=0.05,
                    what="PostgreSQL to end the frozen web's session",
                )
            except AssertionError as timed_out:
                raise AssertionError(f"{timed_out}: {session_seen(backend)!r}") from None
        finally:
            c.signal("web", signal.SIGCONT)
        # Woken, the web process answers that nothing was committed: send it again.
        request.join(30)
        assert answers == [503], (bodies, c.log("web")[-4000:])
        assert c.one("SELECT count(*) FROM engine_job") == 1
