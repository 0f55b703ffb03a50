"""The active master's lease is renewed by a thread of its own: a pass of the loop that takes
longer than the lease (a busy master after a failover) keeps the leadership, and a loop that
stops making progress altogether loses it."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from engine.cluster.election import Leadership, LeadershipLost
from engine.fencing import StaleEpoch
from engine.master.loop import ActiveStep, Master, MasterOptions
from engine.models import ClusterState, MasterLease
from tests.clusterkit import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 0.6


def slow_step(seconds: float, started: threading.Event, finished: threading.Event):
    """A step whose work takes ``seconds`` in the database (as a restore storm's can)."""

    def run(epoch: int) -> bool:
        started.set()
        with connection.cursor() as cur:
            cur.execute("SELECT pg_sleep(%s)", [seconds])
        finished.set()
        return True

    return run


def start(master: Master) -> threading.Thread:
    def run() -> None:
        try:
            master.run()
        finally:
            connections.close_all()  # this thread's sessions end with it

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def lease_row():
    ClusterState.objects.get_or_create(id=1)
    MasterLease.objects.get_or_create(id=1)


def test_a_pass_longer_than_the_lease_keeps_the_leadership(lease_row):
    master = Master(MasterOptions(name="busy", lease_timeout=LEASE))
    started, finished = threading.Event(), threading.Event()
    step = ActiveStep(60.0, slow_step(LEASE * 4, started, finished))
    master.steps = (*master.steps, lambda: master.run_active(step))
    standby = Leadership("standby", lease_timeout=LEASE)
    thread = start(master)
    try:
        assert started.wait(10), "the busy master never led"
        epoch = master.leadership.epoch
        # Throughout the long step the standby finds the lease valid and never leads.
        attempts = 0
        while not finished.is_set():
            assert not standby.campaign(), "a standby took over from a master that was working"
            attempts += 1
        assert attempts > 0
        assert master.leadership.active and master.leadership.epoch == epoch
        assert MasterLease.objects.get(id=1).holder == "busy"
    finally:
        standby.step_down()
        master.stopping.set()
        thread.join(10)


def test_a_loop_that_stops_making_progress_loses_the_leadership(lease_row):
    master = Master(MasterOptions(name="wedged", lease_timeout=LEASE, stall_limit=LEASE))
    started, release = threading.Event(), threading.Event()

    def wedged(epoch: int) -> bool:
        started.set()
        release.wait(30)  # a step that never returns while the test runs
        return True

    master.steps = (*master.steps, lambda: master.run_active(ActiveStep(60.0, wedged)))
    standby = Leadership("standby", lease_timeout=LEASE)
    thread = start(master)
    try:
        assert started.wait(10)
        epoch = master.leadership.epoch
        wait_for(standby.campaign, 10, interval=0.05, what="the standby to take over")
        assert standby.epoch == epoch + 1
        release.set()
        # The wedged master finds out on its next pass and steps down.
        wait_for(lambda: not master.leadership.active, 10, what="the wedged master to step down")
    finally:
        release.set()
        standby.step_down()
        master.stopping.set()
        thread.join(10)


def test_renewal_after_a_takeover_is_refused(lease_row):
    old = Leadership("old", lease_timeout=LEASE)
    assert old.campaign()
    old._keeper.stop()  # as if the process froze: its lease expires
    new = Leadership("new", lease_timeout=LEASE)
    try:
        wait_for(new.campaign, 10, interval=0.05, what="the next master")
        # Its lock session was ended by the takeover; either way it cannot renew.
        with pytest.raises((StaleEpoch, LeadershipLost)):
            old.renew()
        assert MasterLease.objects.get(id=1).holder == "new"
    finally:
        new.step_down()
        old.step_down()
