"""Dirty-job tracking on a live cluster: what its state survives and how it reads.

The state survives master changes (kill -9 of the active master, of every master); a failing
tracking store never blocks recovery and reads UNKNOWN; the threshold changes neither status nor
retries; a finished job reads as it did while running; the feature is disabled by default and
cannot be enabled while an older member is alive. Where each of the specification's
acceptance criteria is shown: the index in tests/test_dirty_cluster_losses.py.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.clusterkit import ROOT, wait_for, wait_for_api
from tests.dirtyclusterkit import (
    all_running,
    cancel,
    dc,
    dirty_task,
    episodes,
    hosts,
    listed,
    quiet,
    recovered,
    streaming,
)
from tests.test_jobs_cluster import TERMINAL, job, post, submit, wait_status

__all__ = ["dc", "quiet"]

pytestmark = pytest.mark.cluster


def test_master_kill9_before_and_right_after_confirmation_counts_exactly_once(quiet):
    """Kill -9 the active master while the attempt is PREPARED, and the
    next one as soon as the confirmation is visible: one confirmation, count 1."""
    c = quiet
    job_id = submit(c, streaming(pipelines=2, threshold=3, interval=2))
    detail = wait_for_api(lambda: all_running(c, job_id), 30, what="the job to run")
    victim = next(iter(hosts(detail)))
    c.signal(victim, signal.SIGKILL)
    wait_for_api(
        lambda: any(a["state"] == "PREPARED" for e in episodes(c, job_id) for a in e["attempts"]),
        10,
        what="a prepared attempt",
    )
    epoch, master = c.active_master()
    c.signal(master, signal.SIGKILL)
    wait_for_api(
        lambda: dirty_task(c, job_id)["recoveryAttemptCount"] >= 1, 30, what="a confirmation"
    )
    second = wait_for(c.active_master, 10, what="a new master")
    assert second[0] > epoch
    c.signal(second[1], signal.SIGKILL)
    c.start(master)
    detail = wait_for_api(lambda: recovered(c, job_id, 1), 30, what="the recovery to complete")
    assert wait_for(c.active_master, 10, what="a third master")[0] > second[0]
    d = dirty_task(c, job_id)
    assert d["recoveryAttemptCount"] == 1 and d["trackingComplete"]
    confirmed = c.one(
        "SELECT count(*) FROM engine_engineevent WHERE job_id = %s AND kind = "
        "'dirty.attempt-confirmed'",
        (job_id,),
    )
    [episode] = episodes(c, job_id)
    assert confirmed == len(episode["attempts"]) and episode["generation"] == 1
    c.start(second[1])
    cancel(c, job_id)


def test_state_survives_the_death_of_every_master(quiet):
    """A partition-owner change: the state lives in PostgreSQL, committed
    synchronously before the change is acknowledged; kill -9 of every master (the processes
    that coordinated it) loses nothing."""
    c = quiet
    assert c.one("SHOW synchronous_commit") == "on"
    job_id = submit(c, streaming(threshold=1))
    detail = wait_for_api(lambda: all_running(c, job_id), 30, what="the job to run")
    c.signal(next(iter(hosts(detail))), signal.SIGKILL)
    before = wait_for_api(lambda: recovered(c, job_id, 1), 30, what="the recovery")["dirtyTask"]
    history = episodes(c, job_id)
    masters = [p["name"] for p in c.status() if p["kind"] == "master"]
    for name in masters:
        c.signal(name, signal.SIGKILL)
    for name in masters:
        c.start(name)
    wait_for(c.active_master, 15, what="a master again")
    assert dirty_task(c, job_id) == before and episodes(c, job_id) == history
    assert before["dirty"] and before["evaluationStatus"] == "DIRTY"
    cancel(c, job_id)


def test_a_tracker_failure_never_blocks_recovery_and_reads_unknown(quiet):
    """The tracking store rejects this job's writes (a trigger) while
    its member is killed: the pipeline restores all the same, the job reads UNKNOWN (not
    CLEAN), and the failure is surfaced as an event."""
    c = quiet
    job_id = submit(c, streaming(threshold=2))
    detail = wait_for_api(lambda: all_running(c, job_id), 30, what="the job to run")
    c.db.execute(
        f"""
        CREATE FUNCTION dirty_fault_{job_id}() RETURNS trigger AS $$
        BEGIN
          IF NEW.job_id = {job_id} THEN RAISE EXCEPTION 'injected failure'; END IF;
          RETURN NEW;
        END $$ LANGUAGE plpgsql;
        CREATE TRIGGER dirty_fault_{job_id} BEFORE UPDATE ON engine_dirtyjobstate
           FOR EACH ROW EXECUTE FUNCTION dirty_fault_{job_id}();
        """
    )
    try:
        c.signal(next(iter(hosts(detail))), signal.SIGKILL)
        wait_for_api(lambda: all_running(c, job_id, restores=1), 30, what="the restore")
    finally:
        c.db.execute(f"DROP TRIGGER dirty_fault_{job_id} ON engine_dirtyjobstate")
        c.db.execute(f"DROP FUNCTION dirty_fault_{job_id}")
    d = dirty_task(c, job_id)
    assert d["evaluationStatus"] == "UNKNOWN" and not d["trackingComplete"]
    assert d["incompleteReason"]
    assert listed(c, job_id, "&evaluationStatus=UNKNOWN") is not None
    assert (
        c.one(
            "SELECT count(*) FROM engine_engineevent WHERE job_id = %s AND kind = "
            "'dirty.tracker-failed'",
            (job_id,),
        )
        >= 1
    )
    cancel(c, job_id)


def test_the_threshold_changes_neither_status_nor_retries_and_finished_reads_the_same(quiet):
    """DIRTY while RUNNING; job.retry.times still decides (the
    second loss fails the job, as without the label); and the finished job's summary and
    episodes read exactly as they did while it ran."""
    c = quiet
    job_id = submit(c, streaming(threshold=1, retries=1))
    detail = wait_for_api(lambda: all_running(c, job_id), 30, what="the job to run")
    c.signal(next(iter(hosts(detail))), signal.SIGKILL)
    detail = wait_for_api(lambda: recovered(c, job_id, 1), 30, what="the recovery")
    assert detail["jobStatus"] == "RUNNING" and detail["dirtyTask"]["evaluationStatus"] == "DIRTY"
    running, history = detail["dirtyTask"], episodes(c, job_id)
    listed_running = listed(c, job_id)
    # Finished (cancelled here): the same summary, the same episodes, the same list entry.
    other = submit(c, streaming(threshold=1, retries=1))
    finished = cancel(c, job_id)
    assert finished["dirtyTask"] == running and episodes(c, job_id) == history
    assert listed(c, job_id) == listed_running
    assert c.one("SELECT count(*) FROM engine_dirtyjobstate WHERE job_id = %s", (job_id,)) == 0
    # Retry behaviour unchanged by DIRTY: a second loss exceeds job.retry.times = 1.
    detail = wait_for_api(lambda: all_running(c, other), 30, what="the second job to run")
    c.signal(next(iter(hosts(detail))), signal.SIGKILL)
    wait_for_api(lambda: all_running(c, other, restores=1), 30, what="its restore")
    assert dirty_task(c, other)["dirty"]
    c.restore()
    detail = wait_for_api(lambda: all_running(c, other), 30, what="running again")
    c.signal(next(iter(hosts(detail))), signal.SIGKILL)
    detail = wait_status(c, other, TERMINAL, timeout=30)
    assert detail["jobStatus"] == "FAILED" and "job.retry.times = 1" in detail["errorMsg"]
    assert detail["dirtyTask"]["dirty"] and detail["dirtyTask"]["evaluationStatus"] == "DIRTY"


def test_disabled_by_default_and_old_finished_records_stay_readable(quiet):
    """No option, no state; a finished job without a history record (as
    before this feature) reads DISABLED with every other field intact."""
    c = quiet
    job_id = submit(
        c,
        "env { job.mode = STREAMING }\n"
        "source { FakeSource { rows.per-second = 10, endless = true } }\n"
        "sink { Blackhole {} }",
    )
    wait_for_api(lambda: all_running(c, job_id), 30, what="the job to run")
    assert dirty_task(c, job_id) == {"evaluationStatus": "DISABLED", "dirty": False}
    assert c.one("SELECT count(*) FROM engine_dirtyjobstate WHERE job_id = %s", (job_id,)) == 0
    before = cancel(c, job_id)
    c.db.execute("DELETE FROM history_jobhistory WHERE job_id = %s", (job_id,))
    after = job(c, job_id)
    assert after == before and after["dirtyTask"]["evaluationStatus"] == "DISABLED"
    assert listed(c, job_id) == {"evaluationStatus": "DISABLED", "dirty": False}
    assert listed(c, job_id, "&evaluationStatus=DISABLED") is not None
    assert episodes(c, job_id) == []


def test_an_older_member_refuses_enabling_until_every_member_upgraded(quiet):
    """A worker announcing protocol 1 (a binary from before the feature)
    makes enabling refused with a 400 naming the option; disabled jobs still run; once it is
    replaced by an upgraded one, enabling works."""
    c = quiet
    worker = [p["name"] for p in c.status() if p["kind"] == "worker"][-1]
    c.signal(worker, signal.SIGTERM)
    wait_for(lambda: not c.alive(worker), 20, what="the worker to stop")
    old_env = dict(c.env, KEEL_PROTOCOL_VERSION="1")
    subprocess.run(
        [str(ROOT / "run"), "cluster", "start", worker],
        cwd=ROOT,
        env=old_env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        wait_for(
            lambda: (
                c.one(
                    "SELECT count(*) FROM engine_member WHERE state = 'ALIVE' "
                    "AND protocol_version = 1"
                )
                == 1
            ),
            30,
            what="the old worker to join",
        )
        code, body = post(c, "/api/v1/jobs", {"config": streaming(threshold=2)})
        assert code == 400, body
        [error] = body["errors"]
        assert error["path"] == "env.job.dirty-task.threshold"
        assert worker in error["message"] and "protocol 1" in error["message"]
        disabled = submit(c, streaming(threshold=-1))
        wait_for_api(lambda: all_running(c, disabled), 30, what="a disabled job to run")
        cancel(c, disabled)
    finally:
        c.signal(worker, signal.SIGTERM)
        wait_for(lambda: not c.alive(worker), 20, what="the old worker to stop")
    c.start(worker)
    wait_for(
        lambda: c.alive_members() == 3,
        30,
        what="the upgraded worker",
    )
    job_id = submit(c, streaming(threshold=2))
    assert dirty_task(c, job_id)["evaluationStatus"] in ("CLEAN", "UNKNOWN")
    wait_for_api(lambda: all_running(c, job_id), 30, what="the enabled job to run")
    assert dirty_task(c, job_id)["evaluationStatus"] == "CLEAN"
    cancel(c, job_id)
