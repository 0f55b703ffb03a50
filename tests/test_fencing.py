"""Epoch fencing and event ordering under real concurrency (threads, each with its own
PostgreSQL session, committing for real)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections

from engine.cluster.election import Leadership
from engine.events import append_event
from engine.fencing import StaleEpoch, fenced
from engine.models import ClusterState, EngineEvent, MasterLease
from tests.clusterkit import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def singletons():
    MasterLease.objects.get_or_create(id=1)
    ClusterState.objects.get_or_create(id=1)


def in_thread(fn):
    """Run fn in a thread with its own database session; returns a future."""

    def wrapper():
        try:
            return fn()
        finally:
            connections.close_all()

    return ThreadPoolExecutor(max_workers=1).submit(wrapper)


def backend_waiting_on_lock(app_like: str = "") -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
        return cur.fetchone()[0] > 0


def test_fenced_rejects_a_stale_epoch():
    MasterLease.objects.filter(id=1).update(epoch=5)
    with fenced(5):
        pass
    with pytest.raises(StaleEpoch) as err:
        with fenced(4):
            raise AssertionError("a stale epoch must not get here")
    assert (err.value.mine, err.value.current) == (4, 5)
    with pytest.raises(StaleEpoch):
        with fenced(None):
            pass


def test_takeover_waits_for_fenced_writes_of_the_old_epoch_then_fences_them():
    """A write that began under epoch N commits before epoch N+1 exists; the next is rejected."""
    MasterLease.objects.filter(id=1).update(epoch=1, holder="old")
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    def old_master_write():
        with fenced(1):
            append_event(EngineEvent(kind="test.old-write", epoch=1))
            inside.set()
            release.wait(10)
            order.append("old-commit")

    old = in_thread(old_master_write)
    assert inside.wait(10)
    new = Leadership("new", lease_timeout=3.0)

    def take_over():
        term = new._take_over()
        order.append("takeover")
        return term

    takeover = in_thread(take_over)
    wait_for(backend_waiting_on_lock, 10, what="the takeover to wait for the fenced write")
    assert order == []
    release.set()
    old.result(10)
    term = takeover.result(10)
    new.step_down()
    assert order == ["old-commit", "takeover"]
    assert term.epoch == 2
    with pytest.raises(StaleEpoch):
        with fenced(1):
            append_event(EngineEvent(kind="test.too-late", epoch=1))
    assert not EngineEvent.objects.filter(kind="test.too-late").exists()
    old_seq = EngineEvent.objects.get(kind="test.old-write").seq
    new_seq = EngineEvent.objects.get(kind="master.elected", epoch=2).seq
    assert old_seq < new_seq


def test_event_seq_commits_in_order():
    """A later append waits for an earlier uncommitted one, so ``after=seq`` never skips."""
    first_in, release = threading.Event(), threading.Event()

    def slow():
        from django.db import transaction

        with transaction.atomic():
            event = append_event(EngineEvent(kind="test.first"))
            first_in.set()
            release.wait(10)
        return event.seq

    first = in_thread(slow)
    assert first_in.wait(10)

    def fast():
        from django.db import transaction

        with transaction.atomic():
            return append_event(EngineEvent(kind="test.second")).seq

    second = in_thread(fast)
    wait_for(backend_waiting_on_lock, 10, what="the second append to queue behind the first")
    # While the first is uncommitted, a reader sees neither (nothing to skip past).
    assert not EngineEvent.objects.filter(kind__in=["test.first", "test.second"]).exists()
    release.set()
    assert first.result(10) < second.result(10)


def test_append_events_outside_a_transaction_is_refused():
    with pytest.raises(RuntimeError):
        append_event(EngineEvent(kind="test.loose"))
