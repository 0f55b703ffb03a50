"""The web process opens no connection a job names: a job whose checks connect (Jdbc) is
planned by a worker. With no worker answering, the submission is a 503 that says so (and is
not planned in the web process instead); jobs that connect to nothing are planned in place."""

from __future__ import annotations

import json
import signal
import threading

import psycopg
import pytest
import redis

from engine.protocol import CONTROL_QUEUE, TASK_PLAN_JOB
from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import data_db

__all__ = ["data_db"]

pytestmark = pytest.mark.cluster


def test_connection_checks_run_in_a_worker(db_template, data_db):
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE dst (id bigint, name text, value double precision)")
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")

    def jdbc(table: str) -> dict:
        return {
            "config": "source { FakeSource { } }\n"
            f'sink {{ Jdbc {{ url = "{url}", user = root, password = t, table = {table},'
            " schema_save_mode = ERROR_WHEN_SCHEMA_NOT_EXIST } }"
        }

    fake = {"config": "source { FakeSource { } }\nsink { Blackhole { } }"}
    # A heartbeat timeout longer than the freeze: the worker stays a member throughout.
    c = Cluster(db_template, masters=1, workers=1, slots=4, heartbeat_timeout=30.0)
    c.env["KEEL_CHECK_TIMEOUT"] = "3s"
    with c:
        code, body = c.post("/api/v1/jobs", jdbc("nope"))
        assert code == 400 and body["errors"][0]["path"] == "sink[0].Jdbc.table"
        code, body = c.post("/api/v1/jobs", jdbc("dst"))
        assert code == 201, body

        c.signal("worker-1", signal.SIGSTOP)  # no worker answers
        try:
            code, body = c.post("/api/v1/jobs", jdbc("dst"))
            assert code == 503 and "no worker answered" in body["detail"]
            assert c.post("/api/v1/jobs", fake)[0] == 201  # nothing to connect to: planned here
        finally:
            c.signal("worker-1", signal.SIGCONT)
        # Woken, it answers again (the request sent while it was frozen has expired).
        wait_for(lambda: c.post("/api/v1/jobs", jdbc("dst"))[0] == 201, 30, what="a 201")

        # A worker that takes the plan's message and dies never answers it: the web process
        # asks again, and another (here the same, woken) worker answers in time.
        c.signal("worker-1", signal.SIGSTOP)
        answers: list = []
        try:
            asking = threading.Thread(
                target=lambda: answers.append(c.post("/api/v1/jobs", jdbc("dst"))), daemon=True
            )
            asking.start()
            lost = wait_for(lambda: take_plan_message(c), 10, interval=0.01, what="the plan asked")
        finally:
            c.signal("worker-1", signal.SIGCONT)
        asking.join(30)
        assert answers and answers[0][0] == 201, (lost, answers)


def take_plan_message(c: Cluster) -> bytes | None:
    """The plan task's message, taken off the control queue (as by a worker that then died)."""
    broker = redis.Redis.from_url(c.redis_url)
    for message in broker.lrange(CONTROL_QUEUE, 0, -1):
        if json.loads(message)["headers"].get("task") == TASK_PLAN_JOB:
            return message if broker.lrem(CONTROL_QUEUE, 1, message) else None
    return None
