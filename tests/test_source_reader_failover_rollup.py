"""Which failures restore a reader alone, step by step on real PostgreSQL (tests/enginekit.py):
a running Lane A pipeline whose failed task groups are all readers lost with their member keeps
running, its enumerator and other readers are not cancelled, and a restore step for just those
readers redeploys them as new attempts. Anything else takes the whole-pipeline path, unchanged:
a lost enumerator, Lane B, an ordinary failure, a pipeline not RUNNING, retries used up, and a
second loss while a reader restore is pending (the pending step is withdrawn)."""

from __future__ import annotations

import pytest

from engine.jobs import lifecycle
from engine.master import control
from engine.models import ControlStep, EngineEvent, Job, Member, Pipeline, TaskGroup

pytestmark = pytest.mark.django_db(transaction=True)

JOB = """
env {{ job.mode = STREAMING, parallelism = {parallelism}, job.retry.times = {retries},
      job.retry.interval.seconds = 0, job.dirty-task.threshold = 2 }}
source {{ FakeSource {{ rows.per-second = 10 }} }}
sink {{ Blackhole {{ }} }}
"""


@pytest.fixture
def lane_a(settings):
    """FakeSource on the allow-list: its pipelines are planned in Lane A."""
    settings.ENGINE = {**settings.ENGINE, "source-runtime.managed-connectors": ["FakeSource"]}


def running(engine, parallelism: int = 2, retries: int = 3, spare: int = 1) -> Job:
    """A running job whose every task group has a member of one slot to itself, then ``spare``
    free members of one slot to restore onto."""
    for _ in range(parallelism + 1):
        engine.add_member(slots=1)
    job = engine.submit(config=JOB.format(parallelism=parallelism, retries=retries))
    engine.schedule()
    engine.run_deployed()
    assert engine.running(job)
    for _ in range(spare):
        engine.add_member(slots=1)
    return job


def group(job: Job, kind: str, index: int = 0) -> TaskGroup:
    return TaskGroup.objects.get(job=job, kind=kind, index=index)


def host(job: Job, kind: str, index: int = 0) -> Member:
    return group(job, kind, index).member


def attempts(job: Job) -> dict[tuple[str, int], tuple[str, int]]:
    """(kind, index) -> (status, attempt) of every task group of the job."""
    return {
        (g.kind, g.index): (g.status, g.attempt)
        for g in TaskGroup.objects.filter(job=job).order_by("kind", "index")
    }


def pipeline(job: Job) -> Pipeline:
    return Pipeline.objects.get(job=job)


def steps(job: Job) -> list[tuple[str, str, str, list | None]]:
    return [
        (s.key.rsplit(":", 1)[1], s.kind, s.state, s.payload.get("taskGroups"))
        for s in ControlStep.objects.filter(job=job).order_by("id")
    ]


def test_a_lost_reader_restores_alone_while_the_rest_runs_on(engine, lane_a):
    job = running(engine)
    assert pipeline(job).plan["sourceRuntime"]["lane"] == "A"
    lost = group(job, "READER", 0)
    engine.lose(lost.member)
    engine.fail_lost()

    p = pipeline(job)
    assert (p.status, Job.objects.get(id=job.id).status) == ("RUNNING", "RUNNING")
    assert not TaskGroup.objects.stopping().exists()  # nothing of it is cancelled
    assert steps(job) == [("1", "restore-readers", "PENDING", [lost.id])]
    # Its enumerator sees a reader to wait for, so it keeps its state and its slot.
    assert lifecycle.readers_live(p.id)

    assert control.enqueue_due_steps(engine.epoch)  # the master runs it
    assert attempts(job) == {
        ("ENUMERATOR", 0): ("RUNNING", 1),
        ("READER", 0): ("DEPLOYING", 2),
        ("READER", 1): ("RUNNING", 1),
    }
    p = pipeline(job)
    assert (p.status, p.restore_count) == ("RUNNING", 1)
    step = ControlStep.objects.get(job=job)
    assert (step.state, step.result) == ("DONE", "restored on 1 slots for 1 reader(s)")
    restore = EngineEvent.objects.get(job_id=job.id, kind="pipeline.restore").payload
    assert restore["taskGroups"] == [lost.id] and len(restore["slots"]) == 1
    assert not EngineEvent.objects.filter(
        job_id=job.id, kind="pipeline.status", payload__to="FAILING"
    )

    engine.run_deployed()
    assert engine.running(job) and group(job, "READER", 0).attempt == 2


def test_a_lone_reader_restores_alone_and_its_enumerator_waits_for_it(engine, lane_a):
    job = running(engine, parallelism=1)
    engine.lose(host(job, "READER"))
    engine.fail_lost()
    assert pipeline(job).status == "RUNNING" and lifecycle.readers_live(pipeline(job).id)
    engine.settle()
    assert attempts(job) == {("ENUMERATOR", 0): ("RUNNING", 1), ("READER", 0): ("RUNNING", 2)}


@pytest.mark.parametrize(
    "lost",
    [("ENUMERATOR", 0), ("ENUMERATOR", 0, "READER", 1)],
    ids=["enumerator", "enumerator-and-reader"],
)
def test_a_lost_enumerator_restores_the_whole_pipeline(engine, lane_a, lost):
    job = running(engine, spare=2)
    for kind, index in zip(lost[::2], lost[1::2], strict=True):
        engine.lose(host(job, kind, index))
    engine.fail_lost()
    assert pipeline(job).status == "FAILING"
    engine.settle()
    assert steps(job) == [("1", "restore-pipeline", "DONE", None)]
    assert {attempt for _, attempt in attempts(job).values()} == {2}
    assert engine.running(job)


def test_lane_b_restores_the_whole_pipeline(engine):
    job = running(engine)
    assert pipeline(job).plan["sourceRuntime"]["lane"] == "B"
    engine.lose(host(job, "READER", 0))
    engine.fail_lost()
    assert pipeline(job).status == "FAILING"
    assert TaskGroup.objects.stopping().count() == 2  # the enumerator and the other reader
    engine.settle()
    assert steps(job) == [("1", "restore-pipeline", "DONE", None)]
    assert {attempt for _, attempt in attempts(job).values()} == {2}


def test_a_job_without_checkpoints_restores_the_whole_pipeline(engine, lane_a):
    """Nothing proves what the lost reader had: only a whole restart reads it again."""
    for _ in range(4):
        engine.add_member(slots=1)
    config = JOB.format(parallelism=2, retries=3).replace("STREAMING", "BATCH")
    job = engine.submit(config=config.replace("rows.per-second = 10", "row.num = 10"))
    assert not job.env.get("checkpoint.interval")
    engine.schedule()
    engine.run_deployed()
    engine.lose(host(job, "READER", 0))
    engine.fail_lost()
    assert pipeline(job).status == "FAILING"
    engine.settle()
    assert steps(job) == [("1", "restore-pipeline", "DONE", None)]


def test_an_ordinary_reader_failure_fails_the_pipeline(engine, lane_a):
    job = running(engine)
    engine.ordinary_failure(job)
    assert pipeline(job).status == "FAILING"
    engine.stop_failing()
    assert (pipeline(job).status, Job.objects.get(id=job.id).status) == ("FAILED", "FAILED")
    assert steps(job) == []


def test_a_reader_lost_before_its_pipeline_ran_restores_the_whole_pipeline(engine, lane_a):
    for _ in range(3):
        engine.add_member(slots=1)
    job = engine.submit(config=JOB.format(parallelism=2, retries=3))
    engine.schedule()
    engine.add_member(slots=1)
    engine.lose(host(job, "READER", 0))  # its pipeline still DEPLOYING
    engine.fail_lost()
    assert pipeline(job).status == "FAILING"
    engine.settle()
    assert steps(job) == [("1", "restore-pipeline", "DONE", None)]


def test_with_its_retries_used_up_a_lost_reader_fails_the_job(engine, lane_a):
    job = running(engine, retries=0)
    engine.lose(host(job, "READER", 0))
    engine.fail_lost()
    engine.stop_failing()
    assert Job.objects.get(id=job.id).status == "FAILED" and steps(job) == []


def test_a_reader_restore_counts_against_the_retries(engine, lane_a):
    job = running(engine, retries=1, spare=2)
    engine.lose(host(job, "READER", 0))
    engine.settle()
    assert pipeline(job).restore_count == 1 and engine.running(job)
    engine.lose(host(job, "READER", 1))
    engine.fail_lost()
    engine.stop_failing()
    assert Job.objects.get(id=job.id).status == "FAILED"
    assert [s[:3] for s in steps(job)] == [("1", "restore-readers", "DONE")]


@pytest.mark.parametrize("second", [("READER", 1), ("ENUMERATOR", 0)])
def test_a_second_loss_while_a_reader_restore_is_pending_restores_the_whole_pipeline(
    engine, lane_a, second
):
    job = running(engine, spare=3)
    first = group(job, "READER", 0)
    engine.lose(first.member)
    engine.fail_lost()
    assert steps(job) == [("1", "restore-readers", "PENDING", [first.id])]

    engine.lose(host(job, *second))
    engine.fail_lost()
    assert pipeline(job).status == "FAILING" and steps(job) == []  # withdrawn
    withdrawn = EngineEvent.objects.get(job_id=job.id, kind="pipeline.restore-withdrawn")
    assert withdrawn.payload["taskGroups"] == [first.id]
    engine.settle()
    assert steps(job) == [("1", "restore-pipeline", "DONE", None)]
    assert {attempt for _, attempt in attempts(job).values()} == {2}
    assert engine.running(job) and pipeline(job).restore_count == 1


def test_two_readers_lost_together_restore_together(engine, lane_a):
    for _ in range(2):  # the enumerator alone, both readers on the other member
        engine.add_member(slots=1 if not Member.objects.exists() else 2)
    job = engine.submit(config=JOB.format(parallelism=2, retries=3))
    engine.schedule()
    engine.run_deployed()
    readers = [group(job, "READER", i) for i in (0, 1)]
    assert readers[0].member_id == readers[1].member_id != host(job, "ENUMERATOR").id
    engine.add_member(slots=2)
    engine.lose(readers[0].member)
    engine.fail_lost()
    assert steps(job) == [("1", "restore-readers", "PENDING", [g.id for g in readers])]
    engine.settle()
    assert attempts(job) == {
        ("ENUMERATOR", 0): ("RUNNING", 1),
        ("READER", 0): ("RUNNING", 2),
        ("READER", 1): ("RUNNING", 2),
    }


def test_a_job_cancelled_while_a_reader_restore_is_pending_ends_without_it(engine, lane_a):
    job = running(engine)
    engine.lose(host(job, "READER", 0))
    engine.fail_lost()
    engine.cancel(job)
    assert Job.objects.get(id=job.id).status == "CANCELED"
    assert steps(job) == [] and engine.restore_due() == []
    assert not TaskGroup.objects.filter(job=job).live().exists()


def test_a_reader_restore_without_a_free_slot_waits_and_the_rest_runs_on(engine, lane_a):
    job = running(engine, spare=0)
    engine.lose(host(job, "READER", 0))
    engine.fail_lost()
    assert engine.restore_due() == ["waiting for slots"]
    assert pipeline(job).status == "RUNNING" and group(job, "READER", 1).status == "RUNNING"
    engine.add_member(slots=1)
    assert engine.restore_due() == ["restored"]
    engine.run_deployed()
    assert engine.running(job)
