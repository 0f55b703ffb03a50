"""Every worker write is fenced by member and attempt: a REMOVED member woken from a freeze,
or an attempt the master replaced, cannot move a split's recorded offset."""

from __future__ import annotations

import pytest

from engine.jobs import splits
from engine.jobs.submission import submit_job
from engine.models import SplitAssignment, TaskGroup

pytestmark = pytest.mark.django_db(transaction=True)

JOB = """
env { job.mode = STREAMING, parallelism = 1, job.retry.interval.seconds = 0 }
source { FakeSource { split.num = 2 } }
sink { Blackhole { } }
"""


def offsets(pipeline_id: int) -> dict[str, tuple[int, bool]]:
    return {
        a.split_id: (a.offset, a.done)
        for a in SplitAssignment.objects.filter(pipeline_id=pipeline_id)
    }


def test_a_removed_member_and_a_replaced_attempt_write_nothing(engine):
    first = engine.add_member(slots=4)
    job = submit_job(JOB)
    engine.schedule()
    engine.run_deployed()
    group = TaskGroup.objects.get(job=job, kind="READER")
    pipeline_id = group.pipeline_id
    assert splits.assign(
        pipeline_id, [{"splitId": "a"}, {"splitId": "b"}], readers=1, owned=lambda: True
    )
    old = splits.Reader(group.id, group.attempt, first.id)
    assert splits.record_offsets(old, pipeline_id, {"a": 10})
    assert offsets(pipeline_id) == {"a": (10, False), "b": (0, False)}

    second = engine.add_member(slots=4)
    engine.lose(first)  # frozen past the heartbeat timeout: REMOVED
    assert not splits.record_offsets(old, pipeline_id, {"a": 5})
    assert not splits.record_progress(old, pipeline_id, 9, 9, 1.0, {"a": 6})
    assert not splits.mark_done(old, pipeline_id, "b", 3)
    assert offsets(pipeline_id) == {"a": (10, False), "b": (0, False)}

    engine.settle()  # restored on the second member (attempt 2), its splits assigned anew
    assert splits.assign(
        pipeline_id, [{"splitId": "a"}, {"splitId": "b"}], readers=1, owned=lambda: True
    )
    group.refresh_from_db()
    assert (group.attempt, group.member_id) == (2, second.id)
    current = splits.Reader(group.id, group.attempt, second.id)
    stale = splits.Reader(group.id, 1, second.id)
    assert not splits.record_offsets(stale, pipeline_id, {"a": 1})
    assert not splits.record_progress(stale, pipeline_id, 9, 9, 1.0, {"a": 2})
    assert splits.mark_done(current, pipeline_id, "b", 7)
    assert offsets(pipeline_id) == {"a": (0, False), "b": (7, True)}
    group.refresh_from_db()
    assert group.source_received == 0  # no stale report reached the task group

    group.status = "RUNNING"
    group.save(update_fields=["status"])
    assert splits.record_progress(current, pipeline_id, 40, 30, 2.5, {"a": 4})
    assert offsets(pipeline_id) == {"a": (4, False), "b": (7, True)}
    group.refresh_from_db()
    assert (group.source_received, group.sink_written, group.rows_per_second) == (40, 30, 2.5)
