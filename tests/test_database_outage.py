"""A PostgreSQL restart shorter than ``engine.database-outage-tolerance`` is ridden out: the
engine reconnects with backoff, members keep their identity, nothing is restored, and
checkpoints go on. The engine's database is a private server the test stops and starts."""

from __future__ import annotations

import time

import pytest

from tests.clusterkit import Cluster, DatabaseTemplate, wait_for
from tests.faultkit import CHECKPOINTING_STREAM, PrivatePostgres
from tests.test_jobs_cluster import job, submit

pytestmark = pytest.mark.cluster


def test_a_postgres_restart_restores_nothing():
    with PrivatePostgres() as server:
        template = DatabaseTemplate(server.url)
        try:
            with Cluster(template, masters=2, workers=2, slots=4, fresh=True) as c:
                job_id = submit(c, CHECKPOINTING_STREAM)

                wait_for(
                    lambda: c.checkpoints_completed(job_id) >= 2,
                    30,
                    interval=0.05,
                    what="checkpoints",
                )
                members = c.query(
                    "SELECT uuid FROM engine_member WHERE state = 'ALIVE' ORDER BY uuid"
                )
                c.db.close()
                server.stop()
                down_since = time.monotonic()
                # Down for 5 s (the fault), every engine process still running throughout.
                wait_for(
                    lambda: (
                        time.monotonic() - down_since >= 5 and all(p["alive"] for p in c.status())
                    ),
                    15,
                    interval=0.2,
                    what="five seconds of outage",
                )
                server.start()
                before = c.checkpoints_completed(job_id)
                wait_for(
                    lambda: c.checkpoints_completed(job_id) >= before + 2,
                    20,
                    interval=0.1,
                    what="checkpoints again",
                )
                assert all(p["alive"] for p in c.status())
                assert (
                    c.query("SELECT uuid FROM engine_member WHERE state = 'ALIVE' ORDER BY uuid")
                    == members
                )
                assert c.one("SELECT count(*) FROM engine_controlstep") == 0
                detail = job(c, job_id)
                assert detail["jobStatus"] == "RUNNING"
                assert detail["pipelines"][0]["restoreCount"] == 0
        finally:
            template.drop_all()
