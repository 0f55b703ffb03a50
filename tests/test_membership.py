"""Membership on real PostgreSQL sessions: registration, slots, locks, heartbeat fencing, leave."""

from __future__ import annotations

import pytest

from engine.cluster.membership import (
    MemberFenced,
    find_dead_members,
    leave,
    register_member,
    remove_member,
)
from engine.models import ClusterState, EngineEvent, MasterLease, Member, Slot
from tests.clusterkit import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def singletons():
    MasterLease.objects.update_or_create(id=1, defaults={"epoch": 3, "holder": "m"})
    ClusterState.objects.get_or_create(id=1)


@pytest.fixture
def sessions():
    opened = []
    yield opened
    for session in opened:
        session.close()


def test_fixed_member_gets_numbered_slots_a_joined_event_and_its_lock(sessions):
    session = register_member("w-fixed", 3, "FIXED")
    sessions.append(session)
    member = Member.objects.get(id=session.id)
    assert (member.state, member.slot_mode, member.uuid) == ("ALIVE", "FIXED", session.uuid)
    assert list(Slot.objects.filter(member=member).values_list("sequence", "state")) == [
        (1, "FREE"),
        (2, "FREE"),
        (3, "FREE"),
    ]
    joined = EngineEvent.objects.get(kind="member.joined", member=member)
    assert joined.payload["slots"] == 3 and joined.payload["uuid"] == str(session.uuid)
    assert find_dead_members(heartbeat_timeout=60) == []


def test_dynamic_member_has_no_slot_rows(sessions):
    session = register_member("w-dyn", 0, "DYNAMIC")
    sessions.append(session)
    assert Member.objects.get(id=session.id).slot_mode == "DYNAMIC"
    assert not Slot.objects.filter(member_id=session.id).exists()


def test_every_registration_is_a_new_member(sessions):
    first = register_member("w-same", 1, "FIXED")
    second = register_member("w-same", 1, "FIXED")
    sessions += [first, second]
    assert first.uuid != second.uuid and first.id != second.id


def test_ended_session_is_dead_at_once_and_removed_exactly_once(sessions):
    session = register_member("w-crash", 1, "FIXED")
    session.close()  # the process died: PostgreSQL ends the session, the lock goes with it
    dead = wait_for(lambda: find_dead_members(heartbeat_timeout=60), 5, what="the lock to go")
    assert dead == [(session.id, "membership session ended")]
    before = ClusterState.objects.get(id=1).member_event_sequence
    assert remove_member(3, session.id, "membership session ended") is True
    assert remove_member(3, session.id, "membership session ended") is False  # duplicate: no-op
    assert ClusterState.objects.get(id=1).member_event_sequence == before + 1
    assert find_dead_members(heartbeat_timeout=60) == []


def test_stale_heartbeat_is_dead_and_the_removed_member_is_fenced(sessions):
    session = register_member("w-frozen", 1, "FIXED")
    sessions.append(session)
    Member.objects.filter(id=session.id).update(
        last_heartbeat=Member.objects.get(id=session.id).last_heartbeat.replace(year=2000)
    )
    assert find_dead_members(heartbeat_timeout=5) == [(session.id, "heartbeat timeout")]
    assert remove_member(3, session.id, "heartbeat timeout")
    with pytest.raises(MemberFenced):
        session.heartbeat()


def test_heartbeat_refused_after_leave_and_leave_counts_once(sessions):
    session = register_member("w-leave", 1, "FIXED")
    sessions.append(session)
    session.heartbeat()
    before = ClusterState.objects.get(id=1).member_event_sequence
    assert leave(session.id) is True
    assert leave(session.id) is False
    assert ClusterState.objects.get(id=1).member_event_sequence == before + 1
    assert Member.objects.get(id=session.id).state == "LEFT"
    with pytest.raises(MemberFenced):
        session.heartbeat()


def test_a_rejoin_whose_new_session_is_lost_too_tries_again(sessions):
    """After a blip the member reconnects; if that new session is lost as well before it took
    its lock back (the database still restarting), it tries again within the tolerance rather
    than letting a driver error kill the heartbeat thread (which would leave the worker alive
    with no heartbeat)."""
    import threading

    import psycopg
    from django.db import connection

    from engine.cluster.membership import member_application_name
    from tests.clusterkit import admin_conn

    session = register_member("w-rejoin", 1, "FIXED")
    sessions.append(session)
    name = member_application_name(session.uuid)
    db = connection.settings_dict
    blocker = psycopg.connect(dbname=db["NAME"], host=db["HOST"] or None, port=db["PORT"] or None)
    admin = admin_conn()
    try:
        # Hold the member's row so the rejoin's UPDATE waits where we can end its session.
        blocker.execute("SELECT 1 FROM engine_member WHERE id = %s FOR UPDATE", (session.id,))
        admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (name,),
        )

        def waiting_rejoin() -> int | None:
            row = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                " AND wait_event_type = 'Lock'",
                (name,),
            ).fetchone()
            return row[0] if row else None

        outcome: dict = {}

        def beat() -> None:
            try:
                session.heartbeat(20.0)
                outcome["ok"] = True
            except BaseException as exc:  # what the heartbeat thread would die of
                outcome["error"] = exc

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        first = wait_for(waiting_rejoin, 10, what="a rejoin waiting on the member row")
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (first,))
        wait_for(
            lambda: ((pid := waiting_rejoin()) and pid != first) or "error" in outcome,
            10,
            what="a second rejoin",
        )
        blocker.rollback()
        thread.join(20)
        assert outcome == {"ok": True}
        session.heartbeat()  # the new session works and holds the lock
        assert [] == find_dead_members(30)
    finally:
        blocker.close()
        admin.close()
