"""The poll watchdog and admission latency on a real cluster: with a hard budget of 1 ms, a
streaming Lane A FakeSource reader's poll calls that build a block of rows run past it and are
woken while they run (``poll.hardWakeups`` in job detail), its admissions are measured against
their p99 budget (``admissionLatency``), and a cancel ends it CANCELED (its woken call returns
at once, long before the cancellation timeout).

A reader stuck in its poll call cannot be made on a cluster without a connector double in the
worker: tests/test_source_cancellation_task_group.py runs that case in process.
"""

from __future__ import annotations

import pytest

from tests.clusterkit import Cluster, wait_for_api
from tests.test_jobs_cluster import TERMINAL, job, post, submit, wait_status

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def small_budget(db_template):
    c = Cluster(db_template, masters=1, workers=2, slots=2, heartbeat_timeout=3.0)
    c.env["KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS"] = "FakeSource"
    c.env["KEEL_SOURCE_RUNTIME_POLL_HARD_DURATION"] = "1ms"
    with c:
        yield c


def reader_runtime(c: Cluster, job_id: int) -> dict:
    groups = job(c, job_id)["pipelines"][0]["taskGroups"]
    return next(g for g in groups if g["kind"] == "READER").get("sourceRuntime") or {}


def test_polls_past_a_small_hard_budget_are_woken_and_admissions_measured(small_budget):
    job_id = submit(
        small_budget,
        "env { job.mode = STREAMING, parallelism = 1, checkpoint.interval = 500 }\n"
        "source { FakeSource { endless = true, schema { fields { id = bigint, name = string,"
        " score = double, tags = string } } } }\n"
        "sink { Blackhole { } }\n",
    )
    try:
        runtime = wait_for_api(
            lambda: (
                (r := reader_runtime(small_budget, job_id)).get("poll", {}).get("hardWakeups")
                and r.get("admissionLatency", {}).get("count", 0) >= 3
                and r
            ),
            60,
            what="hard wakeups and measured admissions",
        )
        assert runtime["poll"]["records"] > 0 and runtime["lifecycle"] == "RUNNING"
        latency = runtime["admissionLatency"]
        assert set(latency) == {"count", "p99Ms", "maxMs", "overBudget", "budgetMs"}
        assert latency["budgetMs"] == 5.0 and 0 <= latency["p99Ms"] <= latency["maxMs"]
    finally:
        assert post(small_budget, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
        detail = wait_status(small_budget, job_id, TERMINAL, timeout=30)
    assert detail["jobStatus"] == "CANCELED", detail
