"""The terminal transition: a job that finishes, fails or is cancelled ends the same way.

Driven through the engine's own steps on real PostgreSQL (tests/enginekit.py). Whatever ends a
job, every task group, every pipeline and the job itself leave a status event that ends in their
terminal status, and the job gets its finished time and its history record.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from engine.jobs import lifecycle, terminal
from engine.models import EngineEvent, Job, Pipeline, TaskGroup
from engine.states import (
    EXECUTION_TERMINAL,
    JOB_TERMINAL,
    ExecutionStatus,
    InvalidTransition,
    JobStatus,
)
from history.models import JobHistory
from tests.enginekit import Engine

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = """
env { job.mode = BATCH, parallelism = 2, job.retry.times = 0 }
source {
  FakeSource { plugin_output = a, row.num = 10 }
  FakeSource { plugin_output = b, row.num = 10 }
}
sink {
  Blackhole { plugin_input = a }
  Blackhole { plugin_input = b }
}
"""

#: The keys every status event of its kind carries.
SHAPES = {
    "job.status": {"from", "to"},
    "pipeline.status": {"pipelineId", "from", "to"},
    "taskgroup.status": {"taskGroupId", "attempt", "from", "to"},
}


def running(e: Engine) -> Job:
    e.add_member(slots=8)
    job = e.submit(config=BATCH)
    e.schedule()
    e.run_deployed()
    assert e.running(job)
    return job


def report_all(job: Job, status: str, error: str = "") -> None:
    """Every member reports its task groups ended with ``status``."""
    for group in TaskGroup.objects.filter(job=job).live().order_by("id"):
        lifecycle.finish_task_group(group.id, group.attempt, group.member_id, status, error)


def assert_ended_by_events(job: Job) -> None:
    """The job, each pipeline and each task group ended, each with a status event (of the one
    shape of its kind) that took it to where it is; the job has its finish time and record."""
    job.refresh_from_db()
    assert job.status in JOB_TERMINAL and job.finished_at is not None
    assert JobHistory.objects.get(job=job).status == job.status
    events = list(EngineEvent.objects.filter(job_id=job.id, kind__in=SHAPES).order_by("seq"))
    for event in events:
        assert SHAPES[event.kind] <= set(event.payload), event.payload
    last = {}
    for event in events:
        subject = {
            "job.status": lambda p: ("job", job.id),
            "pipeline.status": lambda p: ("pipeline", p["pipelineId"]),
            "taskgroup.status": lambda p: ("taskgroup", p["taskGroupId"]),
        }[event.kind](event.payload)
        last[subject] = event.payload["to"]
    assert last[("job", job.id)] == job.status
    for pipeline in Pipeline.objects.filter(job=job):
        assert pipeline.status in EXECUTION_TERMINAL
        assert last[("pipeline", pipeline.index)] == pipeline.status, pipeline
    for group in TaskGroup.objects.filter(job=job):
        assert group.status in EXECUTION_TERMINAL
        assert last[("taskgroup", group.id)] == group.status, group


def test_a_job_cancelled_before_it_ran_ends_every_pipeline_and_task_group_with_events(engine):
    job = engine.submit(config=BATCH)  # no member: it stays PENDING
    engine.cancel(job)
    assert_ended_by_events(job)
    job_events = EngineEvent.objects.filter(job_id=job.id)
    assert list(
        job_events.filter(kind="job.status").values_list("payload__from", "payload__to")
    ) == [("PENDING", "CANCELED")]
    assert sorted(
        job_events.filter(kind="pipeline.status").values_list("payload__pipelineId", "payload__to")
    ) == [(1, "CANCELED"), (2, "CANCELED")]
    groups = job_events.filter(kind="taskgroup.status")
    assert groups.count() == TaskGroup.objects.filter(job=job).count() == 6
    assert set(groups.values_list("payload__from", "payload__to")) == {("CREATED", "CANCELED")}


def test_finish_fail_and_cancel_end_a_job_with_the_same_events(engine):
    finished = running(engine)
    report_all(finished, ExecutionStatus.FINISHED)

    failed = running(engine)
    reader = TaskGroup.objects.filter(job=failed, kind="READER").order_by("id").first()
    lifecycle.finish_task_group(
        reader.id, reader.attempt, reader.member_id, ExecutionStatus.FAILED, "sink error"
    )
    engine.stop_failing()  # the rest of the job is cancelled as it fails

    cancelled = running(engine)
    engine.cancel(cancelled)

    pending = engine.submit(config=BATCH)
    engine.cancel(pending)

    for job, status in (
        (finished, "FINISHED"),
        (failed, "FAILED"),
        (cancelled, "CANCELED"),
        (pending, "CANCELED"),
    ):
        assert_ended_by_events(job)
        assert job.status == status
    assert "sink error" in failed.error_msg
    fail_events = EngineEvent.objects.filter(job_id=failed.id, kind="job.status")
    assert fail_events.last().payload["errorMsg"] == failed.error_msg


def test_a_job_cannot_end_while_a_placed_task_group_is_live(engine):
    """Placed task groups end by their own reports (or as lost with their member) before the
    roll-up ends the job: ending a job under a running task group is refused, not papered
    over."""
    job = running(engine)
    with pytest.raises(InvalidTransition), transaction.atomic():
        terminal.end_job(Job.objects.select_for_update().get(id=job.id), JobStatus.CANCELED)
    job.refresh_from_db()
    assert job.status == "RUNNING" and job.finished_at is None
    assert not EngineEvent.objects.filter(job_id=job.id, payload__to="CANCELED").exists()
