"""The Jdbc sink's sessions: their options, their names (member, writer, attempt), and the fence
a writer's new attempt puts up against its older ones before it writes."""

from __future__ import annotations

import hashlib
import uuid as uuidlib

import psycopg

from engine.connectors import pg_arrow
from engine.connectors.base import later_sink
from engine.connectors.pg import connect


#: A sink session never waits long or hangs: a lock held by a stuck session, a statement, or a
#: transaction its (frozen) worker left open each end within these.
def sink_session_options(idle_ms: int = 10_000) -> str:
    """The options of a sink session whose transactions may stay idle ``idle_ms``."""
    return (
        "-c lock_timeout=10000 -c statement_timeout=300000"
        f" -c idle_in_transaction_session_timeout={idle_ms}"
        # A timestamp without a zone is UTC (the data plane's), whichever path writes it.
        " -c TimeZone=UTC -c DateStyle=ISO"
    )


SINK_SESSION_OPTIONS = sink_session_options()


#: PostgreSQL keeps 63 bytes of an application_name: a sink session's name is built to fit
#: (a truncated name would hide the session from the fences that look for it).
APPLICATION_NAME_MAX = 63
WRITER_TAG_MAX = 12


def writer_tag(writer: str) -> str:
    """The writer key as it appears in a session name: itself when short, else a digest."""
    if len(writer) <= WRITER_TAG_MAX:
        return writer
    return hashlib.blake2b(writer.encode(), digest_size=WRITER_TAG_MAX // 2).hexdigest()


def member_sink_sessions(member_uuid: str | uuidlib.UUID) -> str:
    """A LIKE pattern for every sink session of one member (ended when it is removed)."""
    return f"keel-sink:{uuidlib.UUID(str(member_uuid)).hex}:%"


def sink_application_name(member_uuid: str, writer: str, attempt: int) -> str:
    """Names a sink session after its member, writer and attempt: the master ends a removed
    member's sink sessions, and a writer's next attempt ends those of the older ones."""
    member = uuidlib.UUID(member_uuid).hex if member_uuid else "-"
    name = f"keel-sink:{member}:{writer_tag(writer)}:{attempt}"
    if len(name) > APPLICATION_NAME_MAX:
        raise ValueError(f"sink session name too long: {name}")
    return name


def _sink_name(context: dict, writer: str) -> str:
    return sink_application_name(context.get("memberUuid", ""), writer, context.get("attempt", 0))


def connect_sink(config: dict, context: dict, writer: str) -> psycopg.Connection:
    return connect(
        config,
        application_name=_sink_name(context, writer),
        options=SINK_SESSION_OPTIONS,
        autocommit=False,
    )


def connect_sink_arrow(
    config: dict,
    context: dict,
    writer: str,
    options: str = SINK_SESSION_OPTIONS,
    autocommit: bool = False,
):
    """The writer's ADBC session, named as its psycopg one: a newer attempt's fence ends both."""
    return pg_arrow.connect(config, _sink_name(context, writer), options, autocommit)


def writer_key(context: dict) -> str:
    """The same for every attempt of one reader's sink: job, pipeline, reader, and the sink's
    index when it is not the first (a pipeline may have several Jdbc sinks). The job is its
    uuid: job ids restart in every engine database, and two clusters (or a cluster whose
    database was made anew) writing to one target must not adopt or end each other's writers.
    A job from before uuids keeps its id, and so the key its staged rows already carry."""
    job = context.get("jobUuid") or context.get("jobId")
    key = f"{job}-{context.get('pipelineId')}-{context.get('readerIndex')}"
    index = later_sink(context)
    return f"{key}-{index}" if index else key


def fence_older_attempts(conn: psycopg.Connection, writer: str, attempt: int) -> None:
    """End the sessions of this writer's older attempts (a zombie frozen mid-COPY, or woken
    after its member was removed), waiting until they are gone, then hold the writer's lock
    for this attempt's life: nothing an older attempt sent can land after this returns."""
    older = (writer_tag(writer), attempt)
    conn.execute("SELECT pg_terminate_backend(pid, 5000) " + _OLDER_SESSIONS, older)
    conn.execute("SELECT pg_stat_clear_snapshot()")  # the activity as it is now
    if conn.execute("SELECT count(*) " + _OLDER_SESSIONS, older).fetchone()[0]:
        conn.rollback()
        raise RuntimeError(f"a session of an older attempt of writer {writer} did not end")
    conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"keel-writer:{writer}",))
    conn.commit()


#: The sessions of a writer's older attempts (``FROM ...``: ended, then counted).
_OLDER_SESSIONS = """
  FROM pg_stat_activity
 WHERE application_name LIKE 'keel-sink:%%' AND pid <> pg_backend_pid()
   AND datname = current_database()
   AND split_part(application_name, ':', 3) = %s
   AND split_part(application_name, ':', 4) ~ '^[0-9]+$'
   AND split_part(application_name, ':', 4)::int < %s
"""
