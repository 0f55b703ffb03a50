"""A checkpoint in flight when the active master dies is taken over at once by the next one:
its missing barriers are sent again (a task group handles a barrier once), never left to time
out."""

from __future__ import annotations

import json
import signal
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from engine.jobs import checkpoints
from engine.jobs.submission import submit_job
from engine.master import commands, orchestration
from engine.models import Checkpoint, TaskGroup
from engine.protocol import member_queue
from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import post, submit

STREAMING = """
env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 300,
      checkpoint.timeout = 30000, job.retry.interval.seconds = 0, job.retry.times = 50 }
source { FakeSource { rows.per-second = 50 } }
sink { Blackhole { } }
"""


def barriers_on(broker: redis.Redis, queue: str) -> list[list]:
    """The barrier commands waiting on a member's queue (their args), consumed."""
    with broker.pipeline(transaction=True) as pipe:  # read and empty it in one step
        messages, _ = pipe.lrange(queue, 0, -1).delete(queue).execute()
    sent = [json.loads(message)["headers"] for message in messages]
    return sorted(
        json.loads(h["argsrepr"].replace("'", '"'))
        for h in sent
        if h["task"] == "engine.checkpoint.barrier"
    )


@pytest.mark.django_db(transaction=True)
def test_the_next_master_sends_the_barriers_a_dead_one_never_sent(engine):
    member = engine.add_member(slots=4)
    queue = member_queue(member.name)
    broker = redis.Redis.from_url(settings.REDIS_URL)
    broker.delete(queue)
    job = submit_job(STREAMING)
    engine.schedule()
    engine.run_deployed()
    groups = {g.kind: g for g in TaskGroup.objects.filter(job=job)}
    # The master commits checkpoint N, then dies before its barriers go out.
    triggered = checkpoints.trigger_due(engine.epoch)
    checkpoint_id = triggered[0][0]
    assert len(triggered) == 2
    engine.new_master()

    orchestration.coordinate_checkpoints(engine.epoch)
    # The outbox publishes one command at a time: read the queue once all of them are out.
    assert commands.outbox.flush(5)
    expected = sorted([g.id, g.attempt, str(member.uuid), checkpoint_id] for g in groups.values())
    assert barriers_on(broker, queue) == expected

    # Under its own epoch it re-sends only after BARRIER_RESEND, and only what is unacked.
    orchestration.coordinate_checkpoints(engine.epoch)
    assert commands.outbox.flush(5)
    assert barriers_on(broker, queue) == []
    enumerator, reader = groups["ENUMERATOR"], groups["READER"]
    assert checkpoints.acknowledge(checkpoint_id, enumerator.id, enumerator.attempt, {})
    Checkpoint.objects.filter(id=checkpoint_id).update(
        barriers_sent_at=timezone.now() - timedelta(seconds=checkpoints.BARRIER_RESEND + 1)
    )
    orchestration.coordinate_checkpoints(engine.epoch)
    assert commands.outbox.flush(5)
    assert barriers_on(broker, queue) == [
        [reader.id, reader.attempt, str(member.uuid), checkpoint_id]
    ]
    assert Checkpoint.objects.get(id=checkpoint_id).state == "PENDING"


@pytest.fixture(scope="module")
def tc(db_template):
    with Cluster(db_template, masters=2, workers=3, slots=12, heartbeat_timeout=2.0) as c:
        yield c


def pipelines(c: Cluster) -> dict[int, tuple[int, int, int]]:
    """{pipeline id: (restore count, checkpoints completed, checkpoints failed)}."""
    rows = c.query(
        "SELECT id, restore_count, checkpoints_completed, checkpoints_failed FROM engine_pipeline"
    )
    return {r[0]: r[1:] for r in rows}


@pytest.mark.cluster
def test_killing_the_master_and_a_worker_together_fails_no_checkpoint_of_a_job_that_lost_nothing(
    tc,
):
    """10 streaming jobs checkpointing every 300 ms; six times, kill -9 the active master and a
    worker at the same instant. Every pipeline that lost nothing (no task group on that worker)
    fails no checkpoint and completes one again within 10 s of the kill (the checkpoint timeout
    is 30 s)."""
    jobs = [submit(tc, STREAMING) for _ in range(10)]
    wait_for(
        lambda: (
            tc.one(
                "SELECT count(*) FROM engine_pipeline WHERE status = 'RUNNING' "
                "AND checkpoints_completed > 0"
            )
            == len(jobs)
        ),
        60,
        interval=0.1,
        what="every job to run and checkpoint",
    )
    checked = 0
    for turn in range(6):
        failed, untouched = kill_master_and_worker(tc, len(jobs), turn)
        assert not failed, f"round {turn}: failed checkpoints {failed}"
        checked += untouched
    assert checked >= 30  # most rounds had jobs that lost nothing


def all_running(c: Cluster, count: int) -> None:
    wait_for(
        lambda: c.one("SELECT count(*) FROM engine_pipeline WHERE status = 'RUNNING'") == count,
        30,
        interval=0.05,
        what="every pipeline to run",
    )


def placement(c: Cluster) -> dict[str, set[int]]:
    """{worker name: pipelines with a task group on it}, every ALIVE worker included."""
    rows = c.query(
        "SELECT m.name, t.pipeline_id FROM engine_member m LEFT JOIN engine_taskgroup t"
        " ON t.member_id = m.id AND t.status = 'RUNNING' WHERE m.state = 'ALIVE'"
    )
    out: dict[str, set[int]] = {}
    for name, pipeline in rows:
        out.setdefault(name, set()).update([pipeline] if pipeline else [])
    return out


def kill_master_and_worker(c: Cluster, count: int, turn: int) -> tuple[dict[int, int], int]:
    """One round: kill the active master and the worker hosting the fewest pipelines (by turn
    among equals). Returns ({pipeline: checkpoints failed} of the pipelines that lost nothing,
    how many those were)."""
    c.restore()
    epoch, master = wait_for(c.active_master, 15, what="an active master")
    all_running(c, count)
    before = pipelines(c)
    hosted = placement(c)
    names = sorted(hosted)
    victim = min(names, key=lambda n: (len(hosted[n]), (names.index(n) - turn) % len(names)))
    untouched = [p for p in before if p not in hosted[victim]]
    c.signal(master, signal.SIGKILL)
    c.signal(victim, signal.SIGKILL)
    wait_for(lambda: (a := c.active_master()) and a[0] > epoch, 15, what="the next master")
    wait_for(
        lambda: all(pipelines(c)[p][1] > before[p][1] for p in untouched),
        10,
        interval=0.05,
        what="a checkpoint of every job that lost nothing",
    )
    all_running(c, count)  # the lost jobs restored
    after = pipelines(c)
    failed = {p: after[p][2] - before[p][2] for p in untouched if after[p][2] != before[p][2]}
    return failed, len(untouched)


@pytest.mark.cluster
def test_three_master_kills_fail_no_checkpoint(tc):
    """Seed 003's run: three kill -9 of the active master under checkpointing jobs, and not
    one checkpoint FAILED; every job checkpoints again after each."""
    tc.restore()
    jobs = [submit(tc, STREAMING) for _ in range(3)]
    all_running(tc, tc.one("SELECT count(*) FROM engine_pipeline"))
    failed = tc.one("SELECT coalesce(sum(checkpoints_failed), 0) FROM engine_pipeline")
    for _ in range(3):
        tc.restore()
        epoch, master = wait_for(tc.active_master, 15, what="an active master")
        before = pipelines(tc)
        tc.signal(master, signal.SIGKILL)
        wait_for(lambda e=epoch: (a := tc.active_master()) and a[0] > e, 15, what="a new master")
        wait_for(
            lambda b=before: all(row[1] > b[p][1] for p, row in pipelines(tc).items() if p in b),
            10,
            interval=0.05,
            what="every job to checkpoint again",
        )
    assert tc.one("SELECT coalesce(sum(checkpoints_failed), 0) FROM engine_pipeline") == failed
    for job_id in jobs:
        post(tc, f"/api/v1/jobs/{job_id}/cancel")
