"""The sessions the fences look for: a sink session's name always fits PostgreSQL's 63 bytes
(a truncated one would hide it from the next attempt and from the master), and ending a removed
member's sessions ends every one it may end, even if one of them belongs to a role it may not
signal."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from engine.cluster.membership import end_member_sessions, register_member
from engine.connectors.jdbc_sessions import (
    fence_older_attempts,
    member_sink_sessions,
    sink_application_name,
    writer_key,
)
from engine.models import ClusterState, MasterLease, Member
from tests.clusterkit import admin_conn, wait_for
from tests.faultkit import session_alive

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def singletons():
    MasterLease.objects.update_or_create(id=1, defaults={"epoch": 3, "holder": "m"})
    ClusterState.objects.get_or_create(id=1)


def session(name: str, user: str | None = None) -> psycopg.Connection:
    db = connection.settings_dict
    return psycopg.connect(
        dbname=db["NAME"],
        host=db["HOST"] or None,
        port=db["PORT"] or None,
        user=user or db["USER"] or None,
        application_name=name,
        autocommit=True,
    )


def test_a_long_writer_key_still_names_a_session_the_next_attempt_ends():
    member = "0b0e9ac4-5b0c-4a5e-9a55-7f1f9d0d4c01"
    context = {
        "jobId": 123456789012,
        "pipelineId": 4321,
        "readerIndex": 98765,
        "label": "sink[17]",
    }
    writer = writer_key(context)
    names = [sink_application_name(member, writer, attempt) for attempt in (1, 2, 1234567)]
    assert all(len(name) <= 63 for name in names)
    old = session(names[0])
    new = session(names[1])
    try:
        stored = new.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (old.info.backend_pid,)
        ).fetchone()[0]
        assert stored == names[0]  # not truncated
        fence_older_attempts(new, writer, 2)
        wait_for(lambda: not session_alive(old), 10, what="the older attempt's session to end")
        assert session_alive(new)
        assert new.execute(
            "SELECT %s LIKE %s", (names[1], member_sink_sessions(member))
        ).fetchone()[0]
    finally:
        old.close()
        new.close()


def test_a_session_the_engine_may_not_end_spares_none_of_the_others():
    registered = register_member("w-fenced", 1, "FIXED")
    registered.close()
    member = Member.objects.get(id=registered.id)
    admin = admin_conn()
    admin.execute(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'keel_test_engine')"
        " THEN CREATE ROLE keel_test_engine LOGIN; END IF; END $$"
    )
    name = sink_application_name(str(member.uuid), "7-1-0", 1)
    # A superuser's session the engine's role may not signal, and one of its own.
    foreign = session(name)
    own = session(name, user="keel_test_engine")
    try:
        with connection.cursor() as cur:
            cur.execute("SET ROLE keel_test_engine")
        try:
            end_member_sessions(member)
        finally:
            with connection.cursor() as cur:
                cur.execute("RESET ROLE")
        wait_for(lambda: not session_alive(own), 10, what="the engine's own sink session to end")
        assert session_alive(foreign)
    finally:
        foreign.close()
        own.close()
        admin.close()
