"""Election wedge: a standby frozen after taking the leadership lock but before committing its
takeover holds the lock while the lease still names the previous (dead) holder. The next
candidate finds the real holder in pg_locks and ends it once it has held the lock a lease long
without taking over."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine.cluster.election import Leadership, lock_application_name
from engine.dbsession import connect_dedicated, django_application_name
from engine.locks import LEADERSHIP
from engine.models import ClusterState, MasterLease
from tests.clusterkit import wait_for
from tests.faultkit import session_alive

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_candidate_frozen_before_its_takeover_is_ended_and_the_next_one_leads():
    ClusterState.objects.get_or_create(id=1)
    MasterLease.objects.update_or_create(  # the active master died; its lease has expired
        id=1,
        defaults={
            "epoch": 4,
            "holder": "dead",
            "lock_backend_pid": None,
            "expires_at": timezone.now() - timedelta(seconds=1),
        },
    )
    # "ghost" took the lock, then froze before its takeover committed: two sessions left.
    ghost_lock = connect_dedicated(lock_application_name("ghost"))
    ghost_django = connect_dedicated(django_application_name("ghost", 4242))
    assert ghost_lock.execute("SELECT pg_try_advisory_lock(%s, %s)", LEADERSHIP).fetchone()[0]
    standby = Leadership("standby", lease_timeout=0.5)
    try:
        # At first the ghost may just be committing its takeover: left alone.
        assert not standby.campaign()
        assert session_alive(ghost_lock)
        wait_for(standby.campaign, 5, interval=0.05, what="the standby to lead")
        assert standby.epoch == 5
        assert MasterLease.objects.get(id=1).holder == "standby"
        assert not session_alive(ghost_lock) and not session_alive(ghost_django)
    finally:
        standby.step_down()
        ghost_lock.close()
        ghost_django.close()
