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
from tests.test_jobs_cluster import submit

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
    expected = sorted([g.id, g.attempt, str(member.uuid), checkpoint_id] for g in groups.values())
    assert wait_for(lambda: barriers_on(broker, queue), 5, what="the barriers") == expected

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
    assert wait_for(lambda: barriers_on(broker, queue), 5, what="the re-sent barrier") == [
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
    worker at the same instant. Every pipeline that lost nothing (not restored that round) fails
    no checkpoint and completes one again within 10 s of the kill (detecting the lost worker
    takes 2 s; the checkpoint timeout is 30 s)."""
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
    for round_number in range(6):
        failed = kill_master_and_worker(tc, len(jobs), f"worker-{round_number % 3 + 1}")
        assert not failed, f"round {round_number}: failed checkpoints {failed}"


def all_running(c: Cluster, count: int) -> None:
    wait_for(
        lambda: c.one("SELECT count(*) FROM engine_pipeline WHERE status = 'RUNNING'") == count,
        30,
        interval=0.05,
        what="every pipeline to run",
    )


def kill_master_and_worker(c: Cluster, count: int, victim: str) -> dict[int, int]:
    """One round: returns {pipeline: checkpoints failed} of the pipelines not restored."""
    c.restore()
    epoch, master = wait_for(c.active_master, 15, what="an active master")
    all_running(c, count)
    before = pipelines(c)
    c.signal(master, signal.SIGKILL)
    c.signal(victim, signal.SIGKILL)
    wait_for(lambda: (a := c.active_master()) and a[0] > epoch, 15, what="the next master")

    def settled():
        now = pipelines(c)
        untouched = [p for p, row in now.items() if row[0] == before[p][0]]
        return untouched and all(now[p][1] > before[p][1] for p in untouched)

    wait_for(settled, 10, interval=0.05, what="a checkpoint of every untouched job")
    all_running(c, count)  # the lost jobs restored
    after = pipelines(c)
    return {
        p: after[p][2] - before[p][2]
        for p in after
        if after[p][0] == before[p][0] and after[p][2] != before[p][2]
    }
