"""Terminal-state cleanup on a live cluster: the intent survives two active masters killed in
a row during the delay, a lost Celery message and a dead Celery worker; a job whose worker dies
with no way to restore ends FAILED promptly and is cleaned up like any other.

The cluster runs with the countdown hint off (engine.job-state-cleanup.hint): the process that
ends a job sends no Celery countdown, so every record here is delivered by the active master's
sweep, the one delivery that must survive masters dying (with the hint, a test would pass with
no master at all)."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest
import redis

from engine.protocol import CONTROL_QUEUE
from tests.clusterkit import Cluster, wait_for
from tests.test_jobs_cluster import TERMINAL, job, streaming, submit, wait_status

pytestmark = pytest.mark.cluster

DELAY = 5.0
#: The sweep runs every second; the Celery round trip and a loaded machine add a little.
SWEEP_SLACK = timedelta(seconds=2.5)
BATCH = """
env { job.mode = BATCH, parallelism = 2 }
source { FakeSource { row.num = 200, split.num = 2 } }
sink { Blackhole { } }
"""


@pytest.fixture(scope="module")
def cc(db_template):
    c = Cluster(db_template, masters=3, workers=2, slots=4, heartbeat_timeout=2.0)
    c.env["KEEL_JOB_STATE_CLEANUP_DELAY"] = f"{DELAY}s"
    c.env["KEEL_JOB_STATE_CLEANUP_HINT"] = "false"
    with c:
        yield c


def record(c: Cluster, job_id: int) -> tuple:
    return c.query(
        "SELECT state, due_at, executed_at, executions FROM engine_jobcleanuprecord"
        " WHERE job_id = %s AND kind = 'JOB_STATE'",
        (job_id,),
    )[0]


def running_rows(c: Cluster, job_id: int) -> int:
    return c.one(
        "SELECT (SELECT count(*) FROM engine_pipeline WHERE job_id = %s)"
        " + (SELECT count(*) FROM engine_taskgroup WHERE job_id = %s)",
        (job_id, job_id),
    )


def finished_job(c: Cluster) -> tuple[int, dict]:
    job_id = submit(c, BATCH)
    detail = wait_status(c, job_id, TERMINAL, timeout=60)
    assert detail["jobStatus"] == "FINISHED", detail["errorMsg"]
    return job_id, detail


def wait_done(c: Cluster, job_id: int, ready_at=None) -> tuple:
    """Wait for the record to be executed, once, within the sweep's slack of its due time (or of
    ``ready_at``, when the processes that execute it were only back later)."""
    wait_for(lambda: record(c, job_id)[0] == "DONE", DELAY + 30, interval=0.1, what="cleanup")
    state, due_at, executed_at, executions = record(c, job_id)
    assert executions == 1
    expected = max(due_at, ready_at) if ready_at else due_at
    assert executed_at <= expected + SWEEP_SLACK, (due_at, ready_at, executed_at)
    return state, due_at, executed_at, executions


def kill_active_master(c: Cluster) -> None:
    epoch, holder = wait_for(c.active_master, 15, what="an active master")
    c.signal(holder, signal.SIGKILL)
    wait_for(
        lambda: (now := c.active_master()) and now[0] > epoch, 20, what="the next active master"
    )


def test_a_finished_job_leaves_the_running_lists_at_once_and_two_master_kills_lose_nothing(cc):
    cc.restore()
    job_id, detail = finished_job(cc)
    code, running = cc.api("/api/v1/jobs?jobStatus=RUNNING")
    assert code == 200 and job_id not in [j["jobId"] for j in running["results"]]
    state = record(cc, job_id)[0]
    assert state == "PENDING" and running_rows(cc, job_id) > 0  # kept for late callbacks

    kill_active_master(cc)  # during the delay: the intent is a row, not a timer
    kill_active_master(cc)
    wait_done(cc, job_id)
    # Delivered by the third master's sweep (claiming a record stamps it; no hint was sent).
    assert cc.one(
        "SELECT enqueued_at IS NOT NULL FROM engine_jobcleanuprecord WHERE job_id = %s",
        (job_id,),
    )
    assert running_rows(cc, job_id) == 0
    after = job(cc, job_id)
    for body in (detail, after):
        body.pop("cleanup")
    assert after == detail  # from its history now, exactly as before
    cc.restore()


def test_a_lost_message_and_a_dead_celery_worker_are_recovered_by_the_sweep(cc):
    cc.restore()
    wait_for(lambda: cc.alive_members() == 2, 20, what="two workers")
    job_id, _ = finished_job(cc)
    # The countdown message is lost: dropped from the queue, and every worker that may hold
    # it (Celery reserves ETA messages) dies; new workers start with nothing in memory.
    redis.Redis.from_url(cc.redis_url).delete(CONTROL_QUEUE)
    killed_at = cc.one("SELECT now()")
    for name in ("worker-1", "worker-2"):
        cc.signal(name, signal.SIGKILL)
    # Nothing can execute it now (no Celery worker lives): the intent is still the row.
    assert record(cc, job_id)[0] == "PENDING"
    cc.restore()
    wait_for(
        lambda: (
            cc.one(
                "SELECT count(*) FROM engine_member WHERE state = 'ALIVE' AND started_at > %s",
                (killed_at,),
            )
            == 2
        ),
        30,
        what="two new workers",
    )
    ready_at = cc.one("SELECT now()")
    wait_done(cc, job_id, ready_at)


def test_no_restore_path_fails_promptly_and_is_cleaned_up(cc):
    """BATCH, no checkpoints, job.retry.times = 0: its worker dies, the job ends FAILED within
    5 s (never stuck in between), and its state is cleaned up after the delay."""
    cc.restore()
    wait_for(lambda: cc.alive_members() == 2, 20, what="two workers")
    job_id = submit(
        cc,
        """
        env { job.mode = BATCH, parallelism = 2, job.retry.times = 0 }
        source { FakeSource { row.num = 1000000, rows.per-second = 100, split.num = 2 } }
        sink { Blackhole { } }
        """,
    )
    wait_status(cc, job_id, {"RUNNING"}, timeout=30)
    groups = job(cc, job_id)["pipelines"][0]["taskGroups"]
    reader = next(g for g in groups if g["kind"] == "READER")
    cc.signal(reader["member"]["name"], signal.SIGKILL)
    killed_at = time.monotonic()
    detail = wait_status(cc, job_id, TERMINAL, timeout=10)
    assert detail["jobStatus"] == "FAILED"
    assert time.monotonic() - killed_at < 5.0
    wait_done(cc, job_id)
    assert running_rows(cc, job_id) == 0
    cc.restore()


def slot_holders(c: Cluster) -> dict[int, tuple[str, int | None]]:
    """Every slot of the ALIVE members: (its state, the job whose live task group holds it)."""
    code, slots = c.api("/api/v1/slots")
    assert code == 200
    return {s["id"]: (s["state"], s["owner"] and s["owner"]["jobId"]) for s in slots}


def test_a_cleanup_inside_the_delay_leaves_the_next_jobs_slots_alone(cc):
    """Job A ends, job B takes A's slots inside A's cleanup delay, A's cleanup runs: B's slots
    stay ASSIGNED to B, and a job C lands on other slots (none held twice)."""
    cc.restore()
    wait_for(lambda: cc.alive_members() == 2, 20, what="two workers")
    a, detail = finished_job(cc)
    a_slots = {g["slot"]["id"] for p in detail["pipelines"] for g in p["taskGroups"]}
    b = submit(cc, streaming(1))
    wait_status(cc, b, {"RUNNING"}, timeout=30)
    b_slots = {s for s, (_, owner) in slot_holders(cc).items() if owner == b}
    assert len(b_slots) == 2 and b_slots <= a_slots  # the lowest sequences again
    assert record(cc, a)[0] == "PENDING"  # B was placed inside A's delay

    wait_done(cc, a)
    holders = slot_holders(cc)
    assert {s: holders[s] for s in b_slots} == dict.fromkeys(b_slots, ("ASSIGNED", b))
    c = submit(cc, streaming(1))
    wait_status(cc, c, {"RUNNING"}, timeout=30)
    holders = slot_holders(cc)
    c_slots = {s for s, (_, owner) in holders.items() if owner == c}
    assert len(c_slots) == 2 and not c_slots & b_slots
    assigned = {s for s, (state, _) in holders.items() if state == "ASSIGNED"}
    assert assigned == b_slots | c_slots
    for job_id in (b, c):
        assert cc.post(f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    for job_id in (b, c):
        wait_status(cc, job_id, TERMINAL, timeout=30)
    assert all(state == "FREE" for state, _ in slot_holders(cc).values())
