"""A member drain closes a Lane A reader gracefully before it moves it, on a real cluster.

A STREAMING FakeSource job in Lane A (2 readers, each on a worker of its own, checkpoints every
2 s) writes into a PostgreSQL table and prints every row it delivers (Console, whose lines are
kept per task group attempt). Draining the worker of reader 0 first sends that reader
GRACEFUL_CLOSE: it stops reading, its next snapshot is its last, and once that checkpoint is
committed it reports so; only then is it moved (a reader restore on the spare worker). The
job stays RUNNING, the new attempt starts exactly where the old one stopped (no row delivered
by both attempts: nothing re-read), and every row is in the table exactly once.
"""

from __future__ import annotations

import re
import textwrap

import psycopg
import pytest

from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import TERMINAL, data_db, job, post, submit, wait_status
from tests.test_source_lane_a_cluster import committed, empty_table, group, jdbc_sink

__all__ = ["data_db"]

pytestmark = pytest.mark.cluster
ROW_ID = re.compile(r"'id': (\d+)")


def printed(c: Cluster, task_group_id: int) -> dict[int, list[int]]:
    """The row ids the task group's Console printed, by attempt, in order."""
    out: dict[int, list[int]] = {}
    for attempt, message in c.query(
        "SELECT attempt, message FROM engine_tasklogline"
        " WHERE task_group_id = %s AND logger = 'keel.sink.console' ORDER BY id",
        (task_group_id,),
    ):
        out.setdefault(attempt, []).append(int(ROW_ID.search(message).group(1)))
    return out


def test_a_drained_lane_a_reader_closes_gracefully_and_reads_nothing_twice(db_template, data_db):
    c = Cluster(db_template, masters=1, workers=4, slots=1, heartbeat_timeout=3.0)
    c.env["KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS"] = "FakeSource"
    c.env["KEEL_LOGS_LINES_PER_TASK_GROUP"] = "1000000"
    with c:
        url = empty_table(data_db)
        job_id = submit(
            c,
            textwrap.dedent(f"""
            env {{ job.mode = STREAMING, parallelism = 2, checkpoint.interval = 2000,
                  job.retry.interval.seconds = 0, job.retry.times = 0 }}
            source {{ FakeSource {{ split.num = 2, rows.per-second = 100, endless = true,
                                   schema {{ fields {{ id = bigint, name = string }} }} }} }}
            sink {{
              {jdbc_sink(url)}
              Console {{ limit = 1000000 }}
            }}
            """),
        )
        detail = wait_status(c, job_id, {"RUNNING"}, timeout=60)
        assert detail["pipelines"][0]["sourceRuntime"]["lane"] == "A"
        wait_for(lambda: committed(data_db)[0] > 200, 60, interval=0.2, what="rows committed")
        detail = job(c, job_id)
        reader = group(detail, "READER", 0)
        victim = reader["member"]["name"]
        assert victim != group(detail, "ENUMERATOR")["member"]["name"]

        # job.retry.times = 0: a planned move costs no retry.
        drained = c.cli("cluster", "drain", victim, "--reason", "kernel upgrade", timeout=120)
        assert f"drain of {victim} LEFT" in drained.stdout, drained.stdout

        detail = job(c, job_id)
        moved = group(detail, "READER", 0)
        assert detail["jobStatus"] == "RUNNING" and detail["pipelines"][0]["status"] == "RUNNING"
        assert moved["attempt"] == 2 and moved["member"]["name"] != victim
        assert (group(detail, "READER", 1)["attempt"], group(detail, "ENUMERATOR")["attempt"]) == (
            1,
            1,
        )
        # The master moved it once it had closed, at the checkpoint its last snapshot is in.
        (error,) = c.query(
            "SELECT payload->>'error' FROM engine_engineevent WHERE kind = 'taskgroup.status'"
            " AND (payload->>'taskGroupId')::int = %s AND (payload->>'attempt')::int = 1"
            " AND payload->>'to' = 'FAILED'",
            (reader["taskGroupId"],),
        )[0]
        assert "closed gracefully at checkpoint" in error, error

        tg = reader["taskGroupId"]
        wait_for(
            lambda: len(printed(c, tg).get(2, [])) > 200, 60, interval=0.2, what="attempt 2 reading"
        )
        assert post(c, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
        assert wait_status(c, job_id, TERMINAL, timeout=60)["jobStatus"] == "CANCELED"

        rows = printed(c, tg)
        first, second = rows[1], rows[2]
        # Nothing re-read: no row delivered by both attempts, and the new attempt's first row
        # follows the old one's last in its split (ids s, s + 2, ...).
        assert not set(first) & set(second), sorted(set(first) & set(second))[:10]
        assert second[0] == first[-1] + 2, (first[-3:], second[:3])
        assert first == list(range(first[0], first[-1] + 1, 2))
        # Every committed row exactly once, each split's rows from its first on.
        with psycopg.connect(data_db) as conn:
            ids = sorted(r[0] for r in conn.execute("SELECT id FROM lane_a"))
        assert len(ids) == len(set(ids)) and ids
        for split in (0, 1):
            mine = [i for i in ids if i % 2 == split]
            assert mine == list(range(split, split + 2 * len(mine), 2))
        assert len([i for i in ids if i % 2 == first[0] % 2]) > len(first)  # both attempts'
