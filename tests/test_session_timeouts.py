"""A session PostgreSQL ended for idling in a transaction (a frozen web or worker woken after
the server's timeout) is a lost session like any other: the API answers 503 ("nothing was
committed, send it again"), never a 500, and an engine process's call is tried again. psycopg
files this error under InternalError, not OperationalError."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from engine.api.errors import exception_handler
from engine.dbsession import ride_out, session_lost
from tests.clusterkit import admin_conn, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def session_gone(pid: int) -> bool:
    with admin_conn() as admin:
        return not admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()[0]


def ended_for_idling() -> Exception:
    """The error Django raises for a statement sent after the server ended the session for
    sitting idle in its transaction."""
    connection.ensure_connection()
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SET LOCAL idle_in_transaction_session_timeout = '50ms'")
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
            wait_for(lambda: session_gone(pid), 10, what="the server to end the idle session")
            cur.execute("SELECT 1")
    except Exception as exc:  # the point: what kind of error this is
        return exc
    finally:
        connection.close()
    raise AssertionError("the statement after the timeout succeeded")


def test_an_idle_transaction_ended_by_the_server_is_a_503_not_a_500():
    exc = ended_for_idling()
    assert session_lost(exc), type(exc)
    response = exception_handler(exc, {})
    assert response is not None and response.status_code == 503
    assert response["Retry-After"] == "1"


def test_an_engine_call_rides_out_a_session_ended_for_idling():
    calls = []

    def call() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise ended_for_idling()
        with connection.cursor() as cur:
            cur.execute("SELECT 41 + 1")
            return cur.fetchone()[0]

    assert ride_out(call, "a test call", wait=lambda _: False, tolerance=10) == 42
    assert len(calls) == 2


def test_other_database_errors_are_not_a_lost_session():
    from django.db import IntegrityError

    assert not session_lost(IntegrityError("duplicate key"))
