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
