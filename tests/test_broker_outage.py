"""A broker outage changes nothing: the master loop never waits on Redis (its commands go
through an outbox), so the same master keeps its epoch, nothing is restored, and checkpoints
complete again within seconds of Redis's return. A worker's Celery consumer that crashes on the
broker is replaced inside the member: the process, its member identity and its task groups stay."""

from __future__ import annotations

import time

import pytest
import redis

from tests.clusterkit import Cluster, holds_for, wait_for
from tests.faultkit import CHECKPOINTING_STREAM, PrivateRedis
from tests.test_jobs_cluster import job, post, submit, wait_status

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def broker():
    with PrivateRedis() as b:
        yield b


@pytest.fixture(scope="module")
def c(db_template, broker):
    with Cluster(db_template, masters=2, workers=2, slots=4, redis_url=broker.url) as cluster:
        yield cluster


@pytest.fixture
def running_job(c, broker):
    """A checkpointing job with two checkpoints behind it; cancelled afterwards, so that the
    next test finds every slot free."""
    assert broker.answers()
    wait_for(lambda: c.alive_members() == 2, 20, what="two workers")
    job_id = submit(c, CHECKPOINTING_STREAM)
    wait_for(lambda: c.checkpoints_completed(job_id) >= 2, 30, interval=0.05, what="checkpoints")
    yield job_id
    post(c, f"/api/v1/jobs/{job_id}/cancel", {})
    wait_status(c, job_id, {"CANCELED"}, timeout=30)


def members(c: Cluster) -> set[str]:
    return {str(u) for (u,) in c.query("SELECT uuid FROM engine_member WHERE state = 'ALIVE'")}


def assert_unchanged(c: Cluster, job_id: int, leader: str, before: set[str]) -> None:
    """The same master, the same two members (the same processes, never re-registered), every
    process alive, nothing left in the control queue's table and nothing restored."""
    assert c.active_master() == leader
    dead = [p["name"] for p in c.status() if not p["alive"]]
    assert not dead, {name: c.log(name)[-3000:] for name in dead}
    assert members(c) == before
    assert c.one("SELECT count(*) FROM engine_controlstep") == 0
    detail = job(c, job_id)
    assert detail["jobStatus"] == "RUNNING"
    assert detail["pipelines"][0]["restoreCount"] == 0


@pytest.mark.parametrize("outage", ["stopped", "frozen"])
def test_a_10s_redis_outage_changes_nothing(c, broker, running_job, outage):
    """Redis stopped (connections refused, queues lost) or frozen (SIGSTOP: nothing answers,
    every broker call waits for its socket timeout) for 10 s."""
    leader, before = c.active_master(), members(c)
    broker.stop() if outage == "stopped" else broker.freeze()
    holds_for(lambda: c.active_master() == leader, 10, what="the same active master")
    broker.start() if outage == "stopped" else broker.thaw()
    returned, done = time.monotonic(), c.checkpoints_completed(running_job)
    wait_for(
        lambda: c.checkpoints_completed(running_job) >= done + 2,
        10,
        interval=0.05,
        what="checkpoints again",
    )
    assert time.monotonic() - returned < 5
    assert_unchanged(c, running_job, leader, before)


def test_a_crashed_celery_consumer_is_replaced_inside_the_member(c, broker, running_job):
    """A broker that refuses the consumers' BRPOP answers an error kombu does not treat as a
    connection error: Celery stops its worker ("Unrecoverable error"). The member process starts
    a new Celery worker (again and again while the broker refuses) and, once the broker serves
    again, checkpoints complete as before: no process ended, no member re-registered, nothing
    restored. Before this, the member left and its task groups were restored elsewhere."""
    leader, before = c.active_master(), members(c)
    admin = redis.Redis.from_url(broker.url, socket_timeout=5)
    admin.execute_command("ACL", "SETUSER", "default", "-brpop")
    try:
        wait_for(
            lambda: all("Unrecoverable error" in c.log(name) for name in ("worker-1", "worker-2")),
            20,
            what="both workers' Celery workers to crash",
        )
    finally:
        admin.execute_command("ACL", "SETUSER", "default", "+brpop")
    done = c.checkpoints_completed(running_job)
    wait_for(
        lambda: c.checkpoints_completed(running_job) >= done + 2,
        20,
        interval=0.05,
        what="checkpoints again",
    )
    assert_unchanged(c, running_job, leader, before)
