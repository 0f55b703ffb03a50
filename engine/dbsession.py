"""Dedicated PostgreSQL sessions for liveness (leadership and membership advisory locks).

Liveness rides on a session of its own rather than Django's connection: the lock lives exactly as
long as the session, PostgreSQL ends the session the moment the process dies (its socket closes),
and TCP keepalives end a half-open one within seconds.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.db.backends.signals import connection_created

from engine.errortext import first_line

log = logging.getLogger("keel.dbsession")
T = TypeVar("T")
#: What an unreachable database raises (Django's wrappers and psycopg's own).
UNREACHABLE = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
#: Sessions PostgreSQL ended for sitting idle (in a transaction, or at all): psycopg files them
#: under InternalError, Django then under its own; like an unreachable database, nothing of
#: the transaction was committed and the connection is gone.
_TIMED_OUT = (psycopg.errors.IdleInTransactionSessionTimeout, psycopg.errors.IdleSessionTimeout)


def session_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says this request's database session is gone (unreachable, or ended by
    the server): its transaction committed nothing, and the same work may be tried again."""
    return isinstance(exc, UNREACHABLE) or isinstance(exc.__cause__ or exc, _TIMED_OUT)


def cancelled(exc: BaseException) -> bool:
    """A statement the server cancelled (its statement timeout): the session is there, and
    the same statement would take as long again."""
    return isinstance(exc.__cause__ or exc, psycopg.errors.QueryCanceled)


#: How long data sent on an engine session may stay unacknowledged before the kernel drops the
#: connection (TCP_USER_TIMEOUT): keepalives only probe an idle link, so a link that dies while
#: a statement or its answer is in flight would otherwise hang for the kernel's ~15 minutes of
#: retransmissions (docs/decisions/0037).
TCP_USER_TIMEOUT_MS = 5000
#: Server-side keepalives too: the *server* must notice a vanished client to free its locks.
SERVER_KEEPALIVES = (
    "-c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3"
    f" -c tcp_user_timeout={TCP_USER_TIMEOUT_MS}"
)

#: Engine processes must never sit in a transaction for long: a frozen process would otherwise
#: keep row locks (and block a takeover, or every event append) until someone noticed.
#: PostgreSQL ends such sessions. Kept below half the master lease (3 s) so a frozen holder of a
#: lock cannot make a healthy master miss its renewal.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 1500
#: No lock wait of an engine process (a worker's report, a web request) lasts longer: a stuck
#: holder costs a retry, never a stalled engine.
LOCK_TIMEOUT_MS = 5000
#: No engine statement runs longer on the server, waiting for locks or work included: the
#: server cancels it and frees what it held. (A client waiting on a dead link is bounded by
#: the link checks above: the server cannot tell it anything.) Generous for the engine's own
#: work (its statements are short, batched and indexed); a use that needs a tighter bound
#: sets its own.
STATEMENT_TIMEOUT_MS = 30000
#: Set by ``manage.py web`` for the daphne process it becomes (see keel/asgi.py).
GUARDED_SESSIONS_ENV = "KEEL_GUARDED_SESSIONS"


def django_application_name(process_name: str, pid: int) -> str:
    """The application_name of a process's Django sessions (see settings.DATABASES)."""
    return f"keel:{process_name}:{pid}"


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    return frozenset(option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults())


def _url_options(opts: dict) -> dict:
    """The connection options that came with ``DATABASE_URL`` (``target_session_attrs``,
    ``sslmode``, ...): libpq's keywords among Django's OPTIONS."""
    return {k: v for k, v in opts.items() if k in _libpq_keywords()}


def connect_dedicated(application_name: str) -> psycopg.Connection:
    db = settings.DATABASES["default"]
    opts = db.get("OPTIONS", {})
    params = dict(
        host=db.get("HOST") or None,
        port=db.get("PORT") or None,
        dbname=db["NAME"],
        user=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        application_name=application_name[:63],
        keepalives=opts.get("keepalives", 1),
        keepalives_idle=opts.get("keepalives_idle", 2),
        keepalives_interval=opts.get("keepalives_interval", 1),
        keepalives_count=opts.get("keepalives_count", 3),
        connect_timeout=opts.get("connect_timeout", 3),
        tcp_user_timeout=opts.get("tcp_user_timeout", TCP_USER_TIMEOUT_MS),
        # The URL's own first: libpq takes the last of a repeated setting, and ours win.
        options=(f"{opts['options']} " if opts.get("options") else "")
        + f"{SERVER_KEEPALIVES} -c idle_in_transaction_session_timeout="
        f"{IDLE_IN_TRANSACTION_TIMEOUT_MS} -c statement_timeout={STATEMENT_TIMEOUT_MS}",
    )
    return psycopg.connect(**{**_url_options(opts), **params}, autocommit=True)


def _configure_engine_session(sender, connection, **kwargs) -> None:
    # One round trip (every web request opens a session): the timeouts, and the server's side
    # of the link checks (the client's are in settings.DATABASES).
    with connection.cursor() as cur:
        cur.execute(
            f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_TIMEOUT_MS};"
            f" SET lock_timeout = {LOCK_TIMEOUT_MS};"
            f" SET statement_timeout = {STATEMENT_TIMEOUT_MS}; SET tcp_keepalives_idle = 2;"
            " SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = 3;"
            f" SET tcp_user_timeout = {TCP_USER_TIMEOUT_MS}"
        )


def configure_engine_sessions() -> None:
    """Apply the engine's session settings to every Django connection of this process (the
    master, a worker, the web process): a frozen process's open transaction is ended by
    PostgreSQL, and no lock wait is unbounded."""
    connection_created.connect(_configure_engine_session, dispatch_uid="keel-engine-session")


def outage_tolerance() -> float:
    """``engine.database-outage-tolerance`` in seconds."""
    return float(settings.ENGINE["database-outage-tolerance"])


def ride_out(
    call: Callable[[], T],
    what: str,
    wait: Callable[[float], object] = time.sleep,
    tolerance: float | None = None,
) -> T:
    """Run ``call`` (its own transaction, or none); while the database is unreachable, drop
    this thread's connection and try again with backoff, for at most ``tolerance`` seconds
    (``engine.database-outage-tolerance``) before the error is raised. ``wait`` is how to
    wait: a stop event's ``wait`` ends it early (the call is then made once more), and once
    it has ended early the backoff sleeps (a set event would make the retries spin)."""
    deadline = None
    delay = 0.1
    while True:
        try:
            return call()
        except (*UNREACHABLE, DatabaseError, psycopg.DatabaseError) as exc:
            if not session_lost(exc) or cancelled(exc):
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + (outage_tolerance() if tolerance is None else tolerance)
                log.warning("%s: database unreachable (%s); retrying", what, first_line(exc))
            if now >= deadline:
                raise
            connection.close()
            if wait(delay):
                wait = time.sleep
            delay = min(delay * 2, 1.0)
