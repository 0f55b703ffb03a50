"""A restore that fails part-way gives back only the slots it newly took: the job's surviving
task groups keep theirs (fixed-slot reuse), step by step on real PostgreSQL.

The job has two pipelines; a member hosting only one of them is lost, so pipeline 1 restores
while pipeline 2 runs on. Each test makes the restore fail at a real point: too few slots, the
restore's own transaction failing after it took and assigned slots (a lock held by another
session past the master's lock timeout), and a member it deployed onto removed before the
deployment is taken up. Afterwards exactly the slots of live task groups are ASSIGNED and
pipeline 2 holds the same slots under the same attempts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import OperationalError, connection

from engine.jobs import recovery
from engine.locks import EVENT_APPEND
from engine.models import ControlStep, Member, Pipeline, Slot, TaskGroup

pytestmark = pytest.mark.django_db(transaction=True)


def held(pipeline: Pipeline) -> dict[int, tuple[int, int]]:
    """slot id -> (task group id, attempt), for the pipeline's live task groups."""
    rows = (
        TaskGroup.objects.filter(pipeline=pipeline).live().values_list("slot_id", "id", "attempt")
    )
    return {slot: (group, attempt) for slot, group, attempt in rows}


def assigned() -> set[int]:
    return set(Slot.objects.filter(state="ASSIGNED").values_list("id", flat=True))


def exactly_held() -> set[int]:
    """Every ASSIGNED slot is held by one live task group and every live one holds its own:
    the slot table and the task groups agree. Returns the assigned slots."""
    live = list(TaskGroup.objects.live().values_list("slot_id", flat=True))
    assert None not in live and len(live) == len(set(live)), live
    assert assigned() == set(live)
    return set(live)


def slots_of(member: Member, state: str) -> set[int]:
    return set(Slot.objects.filter(member=member, state=state).values_list("id", flat=True))


@pytest.fixture
def one_pipeline_lost(engine):
    """Members of 3 and 1 slots; pipeline 1 has a task group on the small one, pipeline 2 runs
    wholly on the large one. The small member is lost: pipeline 1's task groups end and its
    restore is due, pipeline 2 runs on. Returns (pipeline 1, pipeline 2, the large member)."""
    large, small = engine.add_member(slots=3), engine.add_member(slots=1)
    job = engine.submit()
    engine.schedule()
    engine.run_deployed()
    first, second = Pipeline.objects.filter(job=job).order_by("index")
    members = TaskGroup.objects.filter(pipeline=second).values_list("member_id", flat=True)
    assert set(members) == {large.id}, "pipeline 2 must run on the large member only"
    assert small.id in TaskGroup.objects.filter(pipeline=first).values_list("member_id", flat=True)
    engine.lose(small)
    engine.fail_lost()
    engine.stop_failing()  # pipeline 1's task group on the large member ends: its slot FREE
    assert not TaskGroup.objects.filter(pipeline=first).live().exists()
    assert ControlStep.objects.filter(job=job, state="PENDING").count() == 1
    assert Pipeline.objects.get(id=second.id).status == "RUNNING" and len(held(second)) == 2
    return first, second, large


def restores_once_a_member_joins(
    engine, first: Pipeline, second: Pipeline, keep: dict, given_back: set[int]
) -> None:
    """A member of one slot joins: the restore runs on the slots it gave back and the new one,
    and the running pipeline still has exactly its own."""
    joined = engine.add_member(slots=1)
    assert engine.restore_due() == ["restored"]
    engine.run_deployed()
    assert held(second) == keep
    assert set(held(first)) == given_back | slots_of(joined, "ASSIGNED")
    assert exactly_held() == set(keep) | set(held(first))
    assert engine.running(first.job)


def test_a_restore_short_of_slots_takes_none_and_leaves_the_running_pipeline_its_own(
    engine, one_pipeline_lost
):
    """Pipeline 1 needs 2 slots and 1 is free: the take locks that one, falls short and gives
    it back; pipeline 2's slots are untouched. Once a member joins, the restore takes the free
    slot and the new member's, and still not one of pipeline 2's."""
    first, second, large = one_pipeline_lost
    keep = held(second)
    free_before = slots_of(large, "FREE")
    assert len(free_before) == 1

    assert engine.restore_due() == ["waiting for slots"]
    assert held(second) == keep
    assert slots_of(large, "FREE") == free_before
    assert exactly_held() == set(keep)
    assert Pipeline.objects.get(id=first.id).status == "FAILING"

    restores_once_a_member_joins(engine, first, second, keep, free_before)


@contextmanager
def event_appends_held() -> Iterator[None]:
    """Another session holds the event-append lock (as a frozen process in the middle of an
    append would) until the block ends."""
    db = connection.settings_dict
    with psycopg.connect(
        dbname=db["NAME"], host=db["HOST"] or None, port=db["PORT"] or None
    ) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", EVENT_APPEND)
        try:
            yield
        finally:
            holder.rollback()


def test_a_restore_that_fails_after_taking_its_slots_gives_back_only_those(
    engine, one_pipeline_lost
):
    """The restore takes and assigns its 2 slots and redeploys pipeline 1, then cannot append
    its events within the master's lock timeout: it fails, and everything it did goes with it
    (its slots FREE again, pipeline 1 not redeployed, the step still due) while pipeline 2
    keeps its slots. The next try restores."""
    first, second, large = one_pipeline_lost
    joined = engine.add_member(slots=1)
    keep = held(second)
    free_before = slots_of(large, "FREE") | slots_of(joined, "FREE")
    attempts = dict(TaskGroup.objects.filter(pipeline=first).values_list("id", "attempt"))
    step = ControlStep.objects.get(job=first.job, state="PENDING")

    with event_appends_held(), pytest.raises(OperationalError, match="lock timeout"):
        recovery.restore_pipeline(step, engine.epoch)
    assert held(second) == keep
    assert slots_of(large, "FREE") | slots_of(joined, "FREE") == free_before
    assert exactly_held() == set(keep)
    assert dict(TaskGroup.objects.filter(pipeline=first).values_list("id", "attempt")) == attempts
    assert ControlStep.objects.get(id=step.id).state == "PENDING"

    assert engine.restore_due() == ["restored"]
    engine.run_deployed()
    assert held(second) == keep and set(held(first)) == free_before
    assert exactly_held() == set(keep) | free_before


def test_a_restore_whose_new_member_is_lost_mid_way_frees_its_slots_not_the_survivors(
    engine, one_pipeline_lost
):
    """The restore deploys pipeline 1 onto the large member's free slot and a member that just
    joined; that member is lost before it takes up its deployment. Pipeline 1 fails again:
    the slot it took on the large member is FREE, pipeline 2 keeps its own, and the next
    restore (a member joined again) runs."""
    first, second, large = one_pipeline_lost
    joined = engine.add_member(slots=1)
    keep = held(second)
    taken_on_large = slots_of(large, "FREE")
    assert engine.restore_due() == ["restored"]
    assert set(held(first)) == taken_on_large | slots_of(joined, "ASSIGNED")
    engine.lose(joined)  # mid-way: deployed there, never taken up
    engine.run_deployed()  # the large member takes up its part

    engine.fail_lost()
    engine.stop_failing()
    assert not TaskGroup.objects.filter(pipeline=first).live().exists()
    assert held(second) == keep
    assert slots_of(large, "FREE") == taken_on_large
    assert exactly_held() == set(keep)

    restores_once_a_member_joins(engine, first, second, keep, taken_on_large)
