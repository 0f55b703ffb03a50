"""A broker outage changes nothing: the master loop never waits on Redis (its commands go
through an outbox), so the same master keeps its epoch, nothing is restored, and checkpoints
complete again within seconds of Redis's return."""

from __future__ import annotations

import time

import pytest

from tests.clusterkit import Cluster, holds_for, wait_for
from tests.faultkit import CHECKPOINTING_STREAM, PrivateRedis
from tests.test_jobs_cluster import job, submit

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("outage", ["stopped", "frozen"])
def test_a_10s_redis_outage_changes_nothing(db_template, outage):
    """Redis stopped (connections refused, queues lost) or frozen (SIGSTOP: nothing answers,
    every broker call waits for its socket timeout) for 10 s."""
    with (
        PrivateRedis() as broker,
        Cluster(db_template, masters=2, workers=2, slots=4, redis_url=broker.url) as c,
    ):
        job_id = submit(c, CHECKPOINTING_STREAM)

        wait_for(
            lambda: c.checkpoints_completed(job_id) >= 2, 30, interval=0.05, what="checkpoints"
        )
        leader = c.active_master()
        broker.stop() if outage == "stopped" else broker.freeze()
        holds_for(lambda: c.active_master() == leader, 10, what="the same active master")
        broker.start() if outage == "stopped" else broker.thaw()
        returned, before = time.monotonic(), c.checkpoints_completed(job_id)
        wait_for(
            lambda: c.checkpoints_completed(job_id) >= before + 2,
            10,
            interval=0.05,
            what="checkpoints again",
        )
        assert time.monotonic() - returned < 5
        assert c.active_master() == leader
        assert all(p["alive"] for p in c.status())
        assert c.alive_members() == 2
        assert c.one("SELECT count(*) FROM engine_controlstep") == 0
        detail = job(c, job_id)
        assert detail["jobStatus"] == "RUNNING"
        assert detail["pipelines"][0]["restoreCount"] == 0
