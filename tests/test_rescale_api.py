"""``POST /api/v1/jobs/{id}/rescale`` and its durable step, on real PostgreSQL without processes
(the master's and members' own functions, tests/enginekit.py):

- 400 naming ``parallelism`` for a bad N; 409 saying why for a job not RUNNING, a Lane B
  pipeline, a job without a completed checkpoint, one at that parallelism already, one whose
  pipeline is restoring (a rescale requested already), one whose checkpoint cannot be dealt by
  split id, or one the cluster has no room for; 403 for a viewer;
- 202 records a RESCALE_PIPELINE step under the pipeline's next restore key; the master's run of
  it (2 -> 3, then 3 -> 1) first only stops the pipeline (FAILING, the job RUNNING, every old
  attempt live on its slot, nothing rewritten or deployed) and waits until every task group
  ended; then it creates or removes readers, rewrites the checkpoint's snapshots (every split
  with its offset on exactly one new reader, the enumerator's tracker naming no reader, the
  removed readers' sinks adopted) and deploys every task group as a new attempt above the old
  readers' highest; job detail shows the new parallelism and the restore;
- a rescale refused when it runs (its checkpoint can no longer be dealt) frees the restore key
  and says why (``pipeline.rescale-refused``): the pipeline runs on, and a later rescale is
  taken; refused once the pipeline stopped, it restores at its old parallelism.
"""

from __future__ import annotations

import itertools

import pytest
from django.conf import settings as django_settings

from engine.jobs import lifecycle
from engine.models import (
    Checkpoint,
    ControlStep,
    EngineEvent,
    Job,
    JobException,
    Pipeline,
    Slot,
    TaskCheckpoint,
    TaskGroup,
)
from engine.sourceruntime.tracker import AssignmentTracker
from engine.states import CheckpointState, ControlStepKind, ExecutionStatus, SlotState
from tests.conftest import role_user
from tests.enginekit import Engine
from tests.test_source_redistribution import snapshot

POOLS = itertools.count()
LANE_A = """
env { job.mode = STREAMING, parallelism = 2, checkpoint.interval = 60000 }
source { FakeSource { rows.per-second = 10, schema { fields { id = bigint } } } }
sink { Blackhole { } }
"""


@pytest.fixture
def engine(transactional_db, settings):
    settings.ENGINE = {
        **django_settings.ENGINE,
        "source-runtime.managed-connectors": ["FakeSource"],
    }
    e = Engine()
    e.add_member(slots=12)
    yield e
    e.close()


def running(engine: Engine, config: str = LANE_A) -> int:
    job = engine.submit(config=config)
    engine.schedule()
    engine.run_deployed()
    job.refresh_from_db()
    assert job.status == "RUNNING"
    return job.id


def rescale(api, job_id: int, body: dict) -> tuple[int, dict]:
    answer = api.post(f"/api/v1/jobs/{job_id}/rescale", body, format="json")
    return answer.status_code, answer.json()


def complete_a_checkpoint(job_id: int) -> Checkpoint:
    """A completed checkpoint of the job's pipeline: reader 0 holds splits a and c, reader 1
    holds b; the enumerator tracks d for reader 1, unproven (it returns to pending)."""
    pipeline = Pipeline.objects.get(job_id=job_id)
    groups = {(g.kind, g.index): g for g in TaskGroup.objects.filter(pipeline=pipeline)}
    checkpoint = Checkpoint.objects.create(
        job_id=job_id,
        pipeline=pipeline,
        state=CheckpointState.COMPLETED,
        expected={str(g.id): g.attempt for g in groups.values()},
    )
    tracker = AssignmentTracker()
    tracker.dispatch("d", 10, 1, 1, 9, 20)
    enumerator = {
        "kind": "enumerator",
        "managed": {
            "enumeratorStateVersion": 1,
            "tracker": tracker.to_json(),
            "pending": ["e"],
            "splits": {s: {"splitId": s} for s in "de"},
            "known": None,
            "epoch": 1,
        },
    }
    states = {
        ("ENUMERATOR", 0): enumerator,
        ("READER", 0): {"managed": snapshot({"a": 5, "c": 7}, [1]), "sinks": [{"k": 0}]},
        ("READER", 1): {"managed": snapshot({"b": 3}, [1]), "sinks": [{"k": 1}]},
    }
    for key, state in states.items():
        group = groups[key]
        TaskCheckpoint.objects.create(
            checkpoint=checkpoint, task_group=group, attempt=group.attempt, state=state
        )
    return checkpoint


def acks(checkpoint: Checkpoint) -> dict[tuple[str, int], dict]:
    return {
        (a.task_group.kind, a.task_group.index): a.state
        for a in TaskCheckpoint.objects.filter(checkpoint=checkpoint).select_related("task_group")
    }


def test_bad_requests_are_refused_and_say_why(engine, api):
    job_id = running(engine)
    for body in ({"parallelism": 0}, {"parallelism": 257}, {"parallelism": "x"}, {}):
        code, answer = rescale(api, job_id, body)
        assert code == 400 and answer["errors"][0]["path"] == "parallelism", (body, answer)
    code, answer = rescale(api, job_id, {"parallelism": 3})
    assert code == 409 and "no completed checkpoint" in answer["detail"]
    assert rescale(api, 999999, {"parallelism": 3})[0] == 404
    viewer = type(api)()
    viewer.force_authenticate(role_user("watcher", "viewer"))
    assert rescale(viewer, job_id, {"parallelism": 3})[0] == 403

    lane_b = running(engine, LANE_A.replace("FakeSource {", "FakeSource { parallelism = 1,"))
    Pipeline.objects.filter(job_id=lane_b).update(
        plan={**Pipeline.objects.get(job_id=lane_b).plan, "sourceRuntime": {"lane": "B"}}
    )
    code, answer = rescale(api, lane_b, {"parallelism": 3})
    assert code == 409 and "Lane B" in answer["detail"]
    unchecked = running(engine, LANE_A.replace("interval = 60000", "interval = 0"))
    code, answer = rescale(api, unchecked, {"parallelism": 3})
    assert code == 409 and "no checkpoints" in answer["detail"]

    complete_a_checkpoint(job_id)
    code, answer = rescale(api, job_id, {"parallelism": 2})
    assert code == 409 and "at parallelism 2 already" in answer["detail"]
    assert rescale(api, job_id, {"parallelism": 3})[0] == 202
    code, answer = rescale(api, job_id, {"parallelism": 4})
    assert code == 409 and "restoring" in answer["detail"]
    api.post(f"/api/v1/jobs/{job_id}/cancel")
    code, answer = rescale(api, job_id, {"parallelism": 4})
    assert code == 409 and "only a RUNNING job" in answer["detail"]


def test_the_step_deals_the_checkpoint_to_the_new_readers(engine, api):
    job_id = running(engine)
    checkpoint = complete_a_checkpoint(job_id)
    code, answer = rescale(api, job_id, {"parallelism": 3})
    assert (code, answer["parallelism"]) == (202, 3)
    step = ControlStep.objects.get(job_id=job_id)
    pipeline = Pipeline.objects.get(job_id=job_id)
    assert (step.kind, step.key) == (ControlStepKind.RESCALE_PIPELINE, f"restore:{pipeline.id}:1")

    old = {g.id: (g.attempt, g.slot_id) for g in TaskGroup.objects.filter(job_id=job_id)}
    assert engine.restore_due() == ["stopping the pipeline"]
    assert_stopped_only(job_id, old, checkpoint)
    engine.run_deployed()  # a metrics or RUNNING report changes nothing
    assert engine.restore_due() == ["waiting for the pipeline"]  # old attempts still run
    assert_stopped_only(job_id, old, checkpoint)
    engine.stop_failing()  # the workers act on the cancels: every old attempt ends
    assert Pipeline.objects.get(id=pipeline.id).status == ExecutionStatus.FAILING
    assert Job.objects.get(id=job_id).status == "RUNNING"  # restoring, not failing
    assert engine.restore_due() == ["rescaled"]
    groups = {(g.kind, g.index): g for g in TaskGroup.objects.filter(job_id=job_id)}
    assert sorted(groups) == [("ENUMERATOR", 0), ("READER", 0), ("READER", 1), ("READER", 2)]
    assert {g.attempt for k, g in groups.items() if k[0] == "READER"} == {2}
    assert all(g.status == ExecutionStatus.DEPLOYING for g in groups.values())
    states = acks(checkpoint)
    held = {
        split["splitId"]: (index, states[("READER", index)]["managed"]["state"]["offsets"])
        for index in range(3)
        for split in states[("READER", index)]["managed"]["state"]["splits"]
    }
    assert {s: offsets[s] for s, (_, offsets) in held.items()} == {"a": 5, "b": 3, "c": 7}
    assert sorted(index for index, _ in held.values()) == [0, 1, 2]  # one each, by split id
    assert states[("READER", 1)]["sinks"] == [{"k": 1}]  # its own sinks' states kept
    cut = states[("ENUMERATOR", 0)]["managed"]
    assert cut["pending"] == ["e", "d"]  # d was never proven: the enumerator's again
    assert all(
        e.reader is None for e in AssignmentTracker.from_json(cut["tracker"]).entries.values()
    )
    engine.run_deployed()
    engine.settle()
    detail = api.get(f"/api/v1/jobs/{job_id}").json()
    assert detail["slotsNeeded"] == 4 and detail["pipelines"][0]["parallelism"] == 3
    assert (detail["pipelines"][0]["status"], detail["pipelines"][0]["restoreCount"]) == (
        "RUNNING",
        1,
    )

    assert rescale(api, job_id, {"parallelism": 1})[0] == 202
    assert engine.restore_due() == ["stopping the pipeline"]
    engine.stop_failing()
    assert engine.restore_due() == ["rescaled"]
    readers = list(TaskGroup.objects.filter(job_id=job_id, kind="READER"))
    assert [(g.index, g.attempt) for g in readers] == [(0, 3)]
    state = acks(checkpoint)[("READER", 0)]
    assert state["managed"]["state"]["offsets"] == {"a": 5, "b": 3, "c": 7}
    assert state["adoptedWriters"] == [1, 2]  # their commits of the checkpoint: reader 0's
    assert Slot.objects.filter(state=SlotState.ASSIGNED).count() == 2
    pipeline.refresh_from_db()
    assert (pipeline.restore_count, pipeline.plan["parallelism"]) == (2, 1)
    assert pipeline.plan["source"]["config"]["parallelism"] == 1  # as the planner copies it


def assert_stopped_only(job_id: int, old: dict[int, tuple[int, int]], checkpoint) -> None:
    """The rescale's first phase: the pipeline FAILING, the job RUNNING, every old attempt
    live on the slot it had, no reader added, the checkpoint as it was."""
    groups = list(TaskGroup.objects.filter(job_id=job_id))
    assert {g.id: (g.attempt, g.slot_id) for g in groups} == old
    assert all(g.status == ExecutionStatus.RUNNING for g in groups)
    assert Slot.objects.filter(
        state=SlotState.ASSIGNED, id__in=[s for _, s in old.values()]
    ).count() == len(old)
    assert Pipeline.objects.get(job_id=job_id).status == ExecutionStatus.FAILING
    assert Job.objects.get(id=job_id).status == "RUNNING"
    assert acks(checkpoint)[("READER", 0)]["managed"]["state"]["offsets"] == {"a": 5, "c": 7}


def undealable(checkpoint: Checkpoint) -> None:
    """Readers 0 and 1 both hold split b: the checkpoint cannot be dealt by split id."""
    ack = TaskCheckpoint.objects.get(
        checkpoint=checkpoint, task_group__kind="READER", task_group__index=0
    )
    ack.state = {**ack.state, "managed": snapshot({"a": 5, "b": 1}, [1])}
    ack.save(update_fields=["state"])


def test_a_refused_rescale_frees_the_restore_key_and_says_why(engine, api):
    job_id = running(engine)
    checkpoint = complete_a_checkpoint(job_id)
    pipeline = Pipeline.objects.get(job_id=job_id)
    undealable(checkpoint)
    code, answer = rescale(api, job_id, {"parallelism": 3})  # refused when asked
    assert code == 409 and "split b is held by readers 0 and 1" in answer["detail"]
    assert not ControlStep.objects.filter(job_id=job_id).exists()

    checkpoint.delete()
    checkpoint = complete_a_checkpoint(job_id)
    assert rescale(api, job_id, {"parallelism": 3})[0] == 202
    undealable(checkpoint)  # a checkpoint that completes meanwhile cannot be dealt
    assert engine.restore_due() == ["refused"]  # before anything stopped
    assert not ControlStep.objects.filter(job_id=job_id).exists()  # the key is free
    pipeline.refresh_from_db()
    assert (pipeline.status, pipeline.restore_count) == (ExecutionStatus.RUNNING, 0)
    assert all(g.status == ExecutionStatus.RUNNING for g in TaskGroup.objects.filter(job_id=job_id))
    refused = EngineEvent.objects.get(job_id=job_id, kind="pipeline.rescale-refused")
    assert refused.payload["parallelism"] == 3 and "split b" in refused.payload["reason"]

    checkpoint.delete()
    checkpoint = complete_a_checkpoint(job_id)
    assert rescale(api, job_id, {"parallelism": 3})[0] == 202  # a later rescale is taken
    assert engine.restore_due() == ["stopping the pipeline"]
    engine.stop_failing()
    undealable(checkpoint)  # refused once stopped: the pipeline restores as it was
    assert engine.restore_due() == ["refused: restores at its old parallelism"]
    assert engine.restore_due() == ["restored"]
    engine.run_deployed()
    pipeline.refresh_from_db()
    assert (pipeline.status, pipeline.restore_count, pipeline.plan["parallelism"]) == (
        ExecutionStatus.RUNNING,
        1,
        2,
    )
    readers = TaskGroup.objects.filter(job_id=job_id, kind="READER")
    assert sorted((g.index, g.attempt) for g in readers) == [(0, 2), (1, 2)]


def test_a_rescale_the_cluster_has_no_room_for_is_refused(engine, api):
    """On the workers its tag_filter allows (5 slots; the fixture's member has 12)."""
    pool = f"small-{next(POOLS)}"
    engine.add_member(slots=5, tags={"pool": pool})
    tagged = LANE_A.replace(
        "checkpoint.interval", f"tag_filter {{ pool = {pool} }}, checkpoint.interval"
    )
    job_id = running(engine, tagged)  # 3 slots
    complete_a_checkpoint(job_id)
    code, answer = rescale(api, job_id, {"parallelism": 5})
    assert code == 409 and "needs 6 slots, the cluster has 5" in answer["detail"]
    running(engine, tagged.replace("parallelism = 2", "parallelism = 1"))  # 2 slots: full
    code, answer = rescale(api, job_id, {"parallelism": 3})
    assert code == 409 and "needs 4 slots and has room for 3 now" in answer["detail"]
    assert rescale(api, job_id, {"parallelism": 1})[0] == 202  # smaller: room enough


def test_a_member_lost_while_it_stops_is_restored_by_the_rescale(engine, api):
    """A reader lost with its member after the stop: the rescale restores it, counted as a
    member loss (not planned: it uses a retry), the failure marked as having caused it."""
    job_id = running(engine)
    complete_a_checkpoint(job_id)
    assert rescale(api, job_id, {"parallelism": 3})[0] == 202
    assert engine.restore_due() == ["stopping the pipeline"]
    lost = TaskGroup.objects.get(job_id=job_id, kind="READER", index=1)
    assert lifecycle.finish_task_group(
        lost.id, lost.attempt, None, ExecutionStatus.FAILED, "lost", lost_member_id=lost.member_id
    )
    engine.stop_failing()
    assert Job.objects.get(id=job_id).status == "RUNNING"
    assert engine.restore_due() == ["rescaled"]
    pipeline = Pipeline.objects.get(job_id=job_id)
    assert (pipeline.restore_count, pipeline.planned_restores) == (1, 0)
    assert JobException.objects.get(task_group_id=lost.id).caused_restore
