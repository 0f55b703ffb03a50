"""Live-cluster helpers of the dirty-job tracking tests (tests/test_dirty_cluster_*.py).

``dc`` is a module-scoped cluster (3 workers of 4 fixed slots, 2 masters) and ``quiet`` the same
cluster restored to rest before each test; a module imports both by name to get its own cluster.
The other helpers submit streaming jobs and read the ``dirtyTask`` summary and the episodes
through the REST API, and wait for recoveries.
"""

from __future__ import annotations

import pytest

from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import TERMINAL, job, post, wait_status


def dirty_cluster(db_template, masters: int = 2) -> Cluster:
    """3 workers of 4 fixed slots, 3 s heartbeat timeout."""
    return Cluster(db_template, masters=masters, workers=3, slots=4, heartbeat_timeout=3.0)


@pytest.fixture(scope="module")
def dc(db_template):
    """3 workers of 4 fixed slots, 2 masters, 3 s heartbeat timeout."""
    with dirty_cluster(db_template) as c:
        yield c


@pytest.fixture
def quiet(dc):
    """Every process running, three alive workers, every slot free, an active master (a job a
    failed test left behind is cancelled first)."""
    dc.restore()
    wait_for(dc.active_master, 15, what="an active master")
    for (job_id,) in dc.query(
        "SELECT id FROM engine_job WHERE status NOT IN ('CANCELED', 'FAILED', 'FINISHED')"
    ):
        post(dc, f"/api/v1/jobs/{job_id}/cancel")
    wait_for(
        lambda: (
            dc.alive_members() == 3
            and dc.one(
                "SELECT count(*) FROM engine_slot s JOIN engine_member m ON m.id = s.member_id"
                " WHERE m.state = 'ALIVE' AND s.state = 'FREE'"
            )
            == 12
        ),
        30,
        what="three alive workers with every slot free",
    )
    return dc


def streaming(pipelines: int = 1, threshold: int = 2, retries: int = 3, interval: int = 0) -> str:
    sources = "\n".join(
        f"  FakeSource {{ plugin_output = s{i}, rows.per-second = 50, endless = true }}"
        for i in range(pipelines)
    )
    sinks = "\n".join(f"  Blackhole {{ plugin_input = s{i} }}" for i in range(pipelines))
    return (
        f"env {{ job.mode = STREAMING, parallelism = 1, job.retry.times = {retries},\n"
        f"      job.retry.interval.seconds = {interval},\n"
        f"      job.dirty-task.threshold = {threshold} }}\n"
        f"source {{\n{sources}\n}}\nsink {{\n{sinks}\n}}\n"
    )


def dirty_task(c: Cluster, job_id: int) -> dict:
    return job(c, job_id)["dirtyTask"]


def episodes(c: Cluster, job_id: int) -> list[dict]:
    code, body = c.api(f"/api/v1/jobs/{job_id}/episodes")
    assert code == 200, body
    return body


def listed(c: Cluster, job_id: int, query: str = "") -> dict | None:
    code, body = c.api(f"/api/v1/jobs?pageSize=500{query}")
    assert code == 200, body
    return next((j["dirtyTask"] for j in body["results"] if j["jobId"] == job_id), None)


def hosts(detail: dict) -> dict[str, set[int]]:
    """member name -> the pipelines it runs a task group of."""
    out: dict[str, set[int]] = {}
    for p in detail["pipelines"]:
        for g in p["taskGroups"]:
            if g["member"] and g["status"] in ("DEPLOYING", "RUNNING"):
                out.setdefault(g["member"]["name"], set()).add(p["pipelineId"])
    return out


def all_running(c: Cluster, job_id: int, restores: int | None = None):
    d = job(c, job_id)
    ok = d["jobStatus"] == "RUNNING" and all(
        p["status"] == "RUNNING" and (restores is None or p["restoreCount"] >= restores)
        for p in d["pipelines"]
    )
    return ok and d


def recovered(c: Cluster, job_id: int, episodes_done: int):
    """The detail once ``episodes_done`` episodes have completed and every pipeline runs."""
    d = all_running(c, job_id)
    if not d or d["dirtyTask"]["activeEpisodeId"] is not None:
        return False
    done = [e for e in episodes(c, job_id) if e["status"] == "COMPLETED"]
    return len(done) >= episodes_done and d


def cancel(c: Cluster, job_id: int) -> dict:
    assert post(c, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    return wait_status(c, job_id, TERMINAL, timeout=30)


def member_uuid(c: Cluster, name: str) -> str:
    return c.one(
        "SELECT uuid::text FROM engine_member WHERE name = %s ORDER BY id DESC LIMIT 1", (name,)
    )
