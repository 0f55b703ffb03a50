"""Slots on real PostgreSQL, step by step: exactly the slots a job holds are assigned. A task
group that ends holds no slot, the delayed cleanup of a finished job frees only what it still
holds, the database refuses two live task groups on one slot, and a dynamic member's cap holds
however its free rows are locked (a take that fails leaves nothing behind)."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.utils import timezone

from engine.cluster import membership
from engine.cluster import slots as slot_transitions
from engine.jobs import cleanup
from engine.models import JobCleanupRecord, Slot, TaskGroup
from engine.states import SlotMode

pytestmark = pytest.mark.django_db(transaction=True)

#: An enumerator and a reader: two slots.
JOB = """
env { job.mode = STREAMING, parallelism = 1 }
source { FakeSource { rows.per-second = 10 } }
sink { Blackhole { } }
"""


def held(job) -> dict[int, int]:
    """slot id -> task group id, for the job's live task groups that hold a slot."""
    return dict(
        TaskGroup.objects.filter(job=job, slot__isnull=False).live().values_list("slot_id", "id")
    )


def assigned() -> set[int]:
    return set(Slot.objects.filter(state="ASSIGNED").values_list("id", flat=True))


def running_job(engine):
    job = engine.submit(config=JOB)
    engine.schedule()
    engine.run_deployed()
    assert engine.running(job)
    return job


def test_a_cleanup_inside_the_delay_leaves_the_next_jobs_slots_alone(engine):
    """Job A ends, job B takes A's slots inside the cleanup delay, A's cleanup runs: B's
    slots stay ASSIGNED to B, and job C lands on the other slots."""
    engine.add_member(slots=4)
    a = running_job(engine)
    a_slots = set(held(a))
    engine.cancel(a)
    a.refresh_from_db()
    assert a.status == "CANCELED"
    # Ended task groups hold no slot; where they ran is kept for the detail.
    assert not TaskGroup.objects.filter(job=a, slot__isnull=False).exists()
    assert set(TaskGroup.objects.filter(job=a).values_list("last_slot_id", flat=True)) == a_slots
    assert assigned() == set()

    b = running_job(engine)
    b_slots = held(b)
    assert set(b_slots) == a_slots  # the lowest sequences again, inside A's delay
    record = JobCleanupRecord.objects.get(job_id=a.id, kind="JOB_STATE")
    JobCleanupRecord.objects.filter(id=record.id).update(
        due_at=timezone.now() - timedelta(seconds=1)
    )
    assert cleanup.execute(record.id) == "done"
    assert not TaskGroup.objects.filter(job=a).exists()
    assert held(b) == b_slots and assigned() == set(b_slots)

    c = running_job(engine)
    assert not set(held(c)) & set(b_slots)
    assert assigned() == set(b_slots) | set(held(c))


def test_the_cleanup_frees_only_what_the_finished_job_still_holds(engine):
    """A slot the finished job's row still names while another job's live task group holds
    it is not the finished job's to free."""
    engine.add_member(slots=4)
    a = running_job(engine)
    engine.cancel(a)
    b = running_job(engine)
    b_slot = next(iter(held(b)))
    record = JobCleanupRecord.objects.get(job_id=a.id, kind="JOB_STATE")
    JobCleanupRecord.objects.filter(id=record.id).update(
        due_at=timezone.now() - timedelta(seconds=1)
    )
    with transaction.atomic():  # rolled back: the check is dropped only in here
        # An ended task group of A naming B's slot, as rows written before ended task groups
        # let go of their slot did (the database refuses that now, hence around the check).
        with connection.cursor() as cur:
            cur.execute(
                "ALTER TABLE engine_taskgroup DROP CONSTRAINT taskgroup_ended_holds_no_slot"
            )
        TaskGroup.objects.filter(job=a).update(slot_id=b_slot)
        assert cleanup.execute(record.id) == "done"
        assert not TaskGroup.objects.filter(job=a).exists()
        assert b_slot in assigned() and held(b)[b_slot]
        transaction.set_rollback(True)


def test_the_database_refuses_two_live_task_groups_on_one_slot_and_an_ended_one_holding_one(
    engine,
):
    engine.add_member(slots=4)
    b = running_job(engine)
    c = running_job(engine)
    b_slot = next(iter(held(b)))
    c_group = TaskGroup.objects.filter(job=c).first()
    with pytest.raises(IntegrityError, match="taskgroup_one_live_per_slot"), transaction.atomic():
        TaskGroup.objects.filter(id=c_group.id).update(slot_id=b_slot)
    engine.cancel(c)
    # Ended, it may not keep a slot; nor may another ended one name a live one's slot.
    with pytest.raises(IntegrityError, match="taskgroup_ended_holds_no_slot"), transaction.atomic():
        TaskGroup.objects.filter(id=c_group.id).update(slot_id=b_slot)
    assert held(b) and not TaskGroup.objects.filter(job=c, slot__isnull=False).exists()


@pytest.fixture
def dynamic_member():
    """A dynamic-slot member that may hold at most 2 slots, with one FREE slot row."""
    session = membership.register_member("dyn", 2, SlotMode.DYNAMIC)
    Slot.objects.create(member_id=session.id, sequence=1, state="FREE")
    yield session
    session.close()


def rows_of(member) -> list[str]:
    return list(Slot.objects.filter(member_id=member.id).order_by("sequence").values_list("state"))


def test_the_dynamic_cap_counts_free_rows_a_concurrent_take_has_locked(dynamic_member):
    """One take locks the FREE row and has not assigned it yet; a second take, on its own
    connection, may create only what the cap leaves (one row), so it cannot get two."""
    locked, release = threading.Event(), threading.Event()
    first: list = []

    def take_one() -> None:
        try:
            with transaction.atomic():
                first.append(slot_transitions.take(1))
                locked.set()
                assert release.wait(30)
                slot_transitions.assign([s for s, _ in first[0]])
        finally:
            locked.set()
            connections.close_all()

    thread = threading.Thread(target=take_one)
    thread.start()
    try:
        assert locked.wait(30) and first and first[0]
        with transaction.atomic():
            second = slot_transitions.take(2)
            if second is not None:
                slot_transitions.assign([s for s, _ in second])
    finally:
        release.set()
        thread.join(30)
    assert second is None
    assert rows_of(dynamic_member) == [("ASSIGNED",)]


def test_a_take_counts_the_free_rows_it_locked_itself_and_a_failed_one_leaves_nothing(
    dynamic_member,
):
    """Three slots from a member capped at two, one FREE row: the take fails, creates no row
    (committed or not) and leaves the FREE row unlocked."""
    with transaction.atomic():
        taken = slot_transitions.take(3)
        assert taken is None, taken
        # Still inside the caller's transaction: the FREE row is not held by the failed take.
        db = connection.settings_dict
        with psycopg.connect(
            dbname=db["NAME"], host=db["HOST"] or None, port=db["PORT"] or None, autocommit=True
        ) as other:
            rows = other.execute(
                "SELECT id FROM engine_slot WHERE member_id = %s FOR UPDATE SKIP LOCKED",
                (dynamic_member.id,),
            ).fetchall()
    assert len(rows) == 1  # not locked
    assert rows_of(dynamic_member) == [("FREE",)]  # and the row it created is not committed
    with transaction.atomic():  # what the cap allows is still given
        assert len(slot_transitions.take(2)) == 2
