"""Dedicated PostgreSQL sessions for liveness (leadership and membership advisory locks).

Liveness rides on a session of its own rather than Django's connection: the lock lives exactly as
long as the session, PostgreSQL ends the session the moment the process dies (its socket closes),
and TCP keepalives end a half-open one within seconds.
"""

from __future__ import annotations

import psycopg
from django.conf import settings
from django.db.backends.signals import connection_created

#: Server-side keepalives too: the *server* must notice a vanished client to free its locks.
SERVER_KEEPALIVES = (
    "-c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3"
)

#: Engine processes must never sit in a transaction for long: a frozen process would otherwise
#: keep row locks (and block a takeover, or every event append) until someone noticed.
#: PostgreSQL ends such sessions. Kept below half the master lease (3 s) so a frozen holder of a
#: lock cannot make a healthy master miss its renewal.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 1500
#: No lock wait of an engine process (a worker's report, a web request) lasts longer: a stuck
#: holder costs a retry, never a stalled engine.
LOCK_TIMEOUT_MS = 5000
#: Set by ``manage.py web`` for the daphne process it becomes (see keel/asgi.py).
GUARDED_SESSIONS_ENV = "KEEL_GUARDED_SESSIONS"


def django_application_name(process_name: str, pid: int) -> str:
    """The application_name of a process's Django sessions (see settings.DATABASES)."""
    return f"keel:{process_name}:{pid}"


def connect_dedicated(application_name: str) -> psycopg.Connection:
    db = settings.DATABASES["default"]
    opts = db.get("OPTIONS", {})
    return psycopg.connect(
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
        options=f"{SERVER_KEEPALIVES} -c idle_in_transaction_session_timeout="
        f"{IDLE_IN_TRANSACTION_TIMEOUT_MS}",
        autocommit=True,
    )


def _configure_engine_session(sender, connection, **kwargs) -> None:
    with connection.cursor() as cur:
        cur.execute(
            "SET idle_in_transaction_session_timeout = %s", [IDLE_IN_TRANSACTION_TIMEOUT_MS]
        )
        cur.execute("SET lock_timeout = %s", [LOCK_TIMEOUT_MS])


def configure_engine_sessions() -> None:
    """Apply the engine's session settings to every Django connection of this process (the
    master, a worker, the web process): a frozen process's open transaction is ended by
    PostgreSQL, and no lock wait is unbounded."""
    connection_created.connect(_configure_engine_session, dispatch_uid="keel-engine-session")
