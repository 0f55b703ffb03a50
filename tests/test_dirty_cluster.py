"""Dirty-job tracking (seed 000) on a live cluster: real workers and masters, kill -9, SIGSTOP,
SIGTERM, and the REST contract (``dirtyTask``, filters, ``/episodes``).

The seed's 15 acceptance criteria, and where each is shown (here on processes; the same at the
level of exact interleavings in tests/test_dirty_tracker.py):
 1. one episode, several pipelines, one attempt: test_kill9_of_a_member_hosting_several_...
 2. a second deployment attempt counts once more: test_a_failed_redeployment_then_another_...
 3. duplicate member-removed / confirmation: test_duplicate_member_removed_delivery_and_...
 4. ordinary failures not counted: test_ordinary_failures_are_not_counted_nor_consume_...
 5. preparation without DEPLOYING not counted: test_a_pod_restart_is_unclassified_... (the
    PREPARED phase) and test_restore_preparation_without_deploying_is_not_counted
 6. a completed episode not consumed: test_ordinary_failures_are_not_counted_nor_consume_...
 7. pod restart UNCLASSIFIED, counted after deployment: test_a_pod_restart_is_unclassified_...
 8. master change before/during confirmation: test_master_kill9_before_and_right_after_...
    and test_master_change_during_confirmation_confirms_once
 9. owner change keeps state (synchronous commit): test_state_survives_the_death_of_every_master
10. missing state / lag / tracker failure UNKNOWN: test_a_tracker_failure_never_blocks_...
    and test_missing_state_lagging_watermark_and_tracker_failure_are_unknown
11. status and retries unchanged: test_the_threshold_changes_neither_status_nor_retries_...
12. running and finished the same: test_the_threshold_changes_..._and_finished_reads_the_same
13. disabled by default, old records readable: test_disabled_by_default_and_old_finished_...
14. mixed versions cannot enable: test_an_older_member_refuses_enabling_until_every_member_...
15. bounded member-removal processing: test_member_removal_stays_bounded_with_many_enabled_jobs,
    test_member_removal_costs_the_same_statements_for_10_or_60_jobs and bench/member_loss
"""

from __future__ import annotations

import signal
import subprocess

import psycopg
import pytest

from tests.clusterkit import ROOT, Cluster, wait_for
from tests.test_jobs_cluster import TERMINAL, data_db, job, post, submit, wait_status

__all__ = ["data_db"]

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def dc(db_template):
    """3 workers of 4 fixed slots, 2 masters, 3 s heartbeat timeout."""
    with Cluster(db_template, masters=2, workers=3, slots=4, heartbeat_timeout=3.0) as c:
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
        f"  FakeSource {{ plugin_output = s{i}, rows.per-second = 50 }}" for i in range(pipelines)
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


def test_kill9_of_a_member_hosting_several_pipelines_counts_one_attempt(quiet):
    """Seed acceptance 1: one member-loss episode affecting multiple pipelines counts one
    first-generation job attempt (not one per pipeline or task group)."""
    c = quiet
    job_id = submit(c, streaming(pipelines=3, threshold=2))
    detail = wait_for(lambda: all_running(c, job_id), 30, what="the job to run")
    assert detail["dirtyTask"]["evaluationStatus"] == "CLEAN"
    victim, affected = max(hosts(detail).items(), key=lambda kv: len(kv[1]))
    assert len(affected) >= 2
    uuid = member_uuid(c, victim)
    c.signal(victim, signal.SIGKILL)
    detail = wait_for(lambda: recovered(c, job_id, 1), 30, what="the recovery to complete")
    d = detail["dirtyTask"]
    assert d["recoveryAttemptCount"] == 1 and d["recoveryEpisodeCount"] == 1
    assert d["memberLossIncidentCount"] == 1 and d["evaluationStatus"] == "CLEAN"
    assert d["lastLostMemberUuid"] == uuid and d["lastLeaveClassification"] == "UNCLASSIFIED"
    assert d["trackingComplete"] and d["lastCountedTime"] > 0
    [episode] = episodes(c, job_id)
    assert episode["generation"] == 1 and episode["classification"] == "UNCLASSIFIED"
    assert [i["lostMemberUuid"] for i in episode["incidents"]] == [uuid]
    assert sorted(a["pipelineId"] for a in episode["attempts"]) == sorted(affected)
    assert {(a["prepareSequence"], a["state"]) for a in episode["attempts"]} == {(1, "CONFIRMED")}
    assert all(
        a["attemptId"] == f"{episode['episodeId']}-{a['pipelineId']}-1" for a in episode["attempts"]
    )
    assert listed(c, job_id) == {
        "dirty": False,
        "evaluationStatus": "CLEAN",
        "recoveryAttemptCount": 1,
    }
    cancel(c, job_id)


@pytest.fixture
def slow_heartbeat(db_template):
    """A cluster whose heartbeat timeout (12 s) outlasts a control-step re-enqueue (10 s): a
    frozen member stays ALIVE long enough to be given part of a redeployment."""
    with Cluster(db_template, masters=1, workers=3, slots=4, heartbeat_timeout=12.0) as c:
        wait_for(c.active_master, 15, what="an active master")
        wait_for(lambda: c.alive_members() == 3, 30, what="three workers")
        yield c


def test_a_failed_redeployment_then_another_counts_two(slow_heartbeat):
    """Seed acceptance 2: the first redeployment lands partly on a member that froze (SIGSTOP)
    and is removed before it runs; the second deployment advances the count exactly once more,
    in the same episode."""
    c = slow_heartbeat
    job_id = submit(c, streaming(threshold=2, retries=5, interval=2))
    detail = wait_for(lambda: all_running(c, job_id), 30, what="the job to run")
    used = set(hosts(detail))
    names = [p["name"] for p in c.status() if p["kind"] == "worker"]
    idle = next(n for n in names if n not in used)
    victim = sorted(used)[0]
    c.signal(idle, signal.SIGSTOP)  # ALIVE for 12 s more: it gets a slot, never runs it
    c.signal(victim, signal.SIGKILL)
    try:
        wait_for(
            lambda: (
                dirty_task(c, job_id)["recoveryAttemptCount"] == 1 and idle in hosts(job(c, job_id))
            ),
            20,
            what="the first redeployment (partly on the frozen member)",
        )
        detail = wait_for(
            lambda: all_running(c, job_id, restores=2), 40, what="the second redeployment"
        )
    finally:
        c.signal(idle, signal.SIGCONT)
    d = wait_for(lambda: recovered(c, job_id, 1), 20, what="the episode to complete")["dirtyTask"]
    assert d["recoveryAttemptCount"] == 2 and d["recoveryEpisodeCount"] == 1
    assert d["memberLossIncidentCount"] == 2
    assert d["dirty"] and d["evaluationStatus"] == "DIRTY" and d["firstDirtyTime"]
    [episode] = episodes(c, job_id)
    assert episode["generation"] == 2
    assert [(a["prepareSequence"], a["state"]) for a in episode["attempts"]] == [
        (1, "CONFIRMED"),
        (2, "CONFIRMED"),
    ]
    assert listed(c, job_id, "&dirty=true")["evaluationStatus"] == "DIRTY"
    assert listed(c, job_id, "&dirty=false") is None
    assert listed(c, job_id, "&evaluationStatus=DIRTY") is not None
    cancel(c, job_id)


def test_duplicate_member_removed_delivery_and_confirmation_change_nothing(quiet):
    """Seed acceptance 3, on a live cluster: after a kill -9 recovery, another process delivers
    the same member-removed event and the same confirmations again: no change."""
    c = quiet
    job_id = submit(c, streaming(pipelines=2))
    detail = wait_for(lambda: all_running(c, job_id), 30, what="the job to run")
    victim = next(iter(hosts(detail)))
    uuid = member_uuid(c, victim)
    c.signal(victim, signal.SIGKILL)
    wait_for(lambda: recovered(c, job_id, 1), 30, what="the recovery")
    before = (dirty_task(c, job_id), episodes(c, job_id))
    events = c.one("SELECT count(*) FROM engine_engineevent WHERE kind LIKE 'dirty.%%'")
    script = f"""
from django.db import transaction
from engine import dirty
from engine.models import ClusterState, Job, Member, RecoveryAttempt
member = Member.objects.get(uuid="{uuid}")
sequence = ClusterState.objects.get(id=1).member_event_sequence
with transaction.atomic():
    assert dirty.on_member_lost(member, sequence, None).registered == 0
for attempt in RecoveryAttempt.objects.filter(job_id={job_id}).select_related("pipeline"):
    with transaction.atomic():
        job = Job.objects.select_for_update().get(id={job_id})
        assert dirty.on_restore_deploying(job, attempt.pipeline, attempt.restore_number, None) == []
print("redelivered")
"""
    out = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=c.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "redelivered" in out.stdout, out.stderr
    assert (dirty_task(c, job_id), episodes(c, job_id)) == before
    assert c.one("SELECT count(*) FROM engine_engineevent WHERE kind LIKE 'dirty.%%'") == events
    cancel(c, job_id)


def test_ordinary_failures_are_not_counted_nor_consume_a_completed_episode(quiet, data_db):
    """Seed acceptance 4 and 6: a job recovers from a kill -9 (episode COMPLETED, count 1);
    then its sink fails on its own (the target table is dropped): the job FAILS as it always
    did, nothing more is counted, and the completed episode stays completed."""
    c = quiet
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint, name text)")
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    job_id = submit(
        c,
        "env { job.mode = STREAMING, parallelism = 1, job.retry.interval.seconds = 0,\n"
        "      checkpoint.interval = 500, job.dirty-task.threshold = 3 }\n"
        "source { FakeSource { rows.per-second = 200,\n"
        "                      schema { fields { id = bigint, name = string } } } }\n"
        f'sink {{ Jdbc {{ url = "{url}", table = t }} }}\n',
    )
    detail = wait_for(lambda: all_running(c, job_id), 30, what="the job to run")
    c.signal(next(iter(hosts(detail))), signal.SIGKILL)
    wait_for(lambda: recovered(c, job_id, 1), 30, what="the recovery")
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("DROP TABLE t CASCADE")
        conn.execute("DROP TABLE IF EXISTS t__keel_stage CASCADE")
    detail = wait_status(c, job_id, TERMINAL, timeout=60)
    assert detail["jobStatus"] == "FAILED"
    assert all(p["restoreCount"] == 1 for p in detail["pipelines"])  # the error did not restore
    d = detail["dirtyTask"]
    assert d["recoveryAttemptCount"] == 1 and d["recoveryEpisodeCount"] == 1
    assert d["evaluationStatus"] == "CLEAN"
    assert [e["status"] for e in episodes(c, job_id)] == ["COMPLETED"]


def test_a_pod_restart_is_unclassified_and_counted_once_deployment_starts(quiet):
    """Seed acceptance 5 and 7: a worker stopped by SIGTERM (as Kubernetes does on a pod
    restart, without trusted planned-leave intent) leaves gracefully; its incident is
    UNCLASSIFIED, and nothing counts until the restored pipeline reaches DEPLOYING."""
    c = quiet
    job_id = submit(c, streaming(threshold=2, interval=3))
    detail = wait_for(lambda: all_running(c, job_id), 30, what="the job to run")
    leaver = next(iter(hosts(detail)))
    c.signal(leaver, signal.SIGTERM)
    d = wait_for(
        lambda: (d := dirty_task(c, job_id))["memberLossIncidentCount"] == 1 and d,
        10,
        what="the incident",
    )
    # Prepared (restore requested, due in 3 s) but not deployed: not counted.
    wait_for(
        lambda: any(a["state"] == "PREPARED" for e in episodes(c, job_id) for a in e["attempts"]),
        10,
        what="the attempt to be prepared",
    )
    assert dirty_task(c, job_id)["recoveryAttemptCount"] == 0
    assert d["lastLeaveClassification"] == "UNCLASSIFIED"
    assert (
        c.one("SELECT state FROM engine_member WHERE uuid = %s::uuid", (d["lastLostMemberUuid"],))
        == "LEFT"
    )
    d = wait_for(lambda: recovered(c, job_id, 1), 30, what="the recovery")["dirtyTask"]
    assert d["recoveryAttemptCount"] == 1
    assert episodes(c, job_id)[0]["incidents"][0]["classification"] == "UNCLASSIFIED"
    c.start(leaver)  # the pod comes back as a new member
    cancel(c, job_id)


def test_master_kill9_before_and_right_after_confirmation_counts_exactly_once(quiet):
    """Seed acceptance 8: kill -9 the active master while the attempt is PREPARED, and the
    next one as soon as the confirmation is visible: one confirmation, count 1."""
    c = quiet
    job_id = submit(c, streaming(pipelines=2, threshold=3, interval=2))
    detail = wait_for(lambda: all_running(c, job_id), 30, what="the job to run")
    victim = next(iter(hosts(detail)))
    c.signal(victim, signal.SIGKILL)
    wait_for(
        lambda: any(a["state"] == "PREPARED" for e in episodes(c, job_id) for a in e["attempts"]),
        10,
        what="a prepared attempt",
    )
    epoch, master = c.active_master()
    c.signal(master, signal.SIGKILL)
    wait_for(lambda: dirty_task(c, job_id)["recoveryAttemptCount"] >= 1, 30, what="a confirmation")
    second = wait_for(c.active_master, 10, what="a new master")
    assert second[0] > epoch
    c.signal(second[1], signal.SIGKILL)
    c.start(master)
    detail = wait_for(lambda: recovered(c, job_id, 1), 30, what="the recovery to complete")
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
    """Seed acceptance 9 (partition-owner change): the state lives in PostgreSQL, committed
    synchronously before the change is acknowledged; kill -9 of every master (the processes
    that coordinated it) loses nothing."""
    c = quiet
    assert c.one("SHOW synchronous_commit") == "on"
    job_id = submit(c, streaming(threshold=1))
    detail = wait_for(lambda: all_running(c, job_id), 30, what="the job to run")
    c.signal(next(iter(hosts(detail))), signal.SIGKILL)
    before = wait_for(lambda: recovered(c, job_id, 1), 30, what="the recovery")["dirtyTask"]
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
    """Seed acceptance 10, live: the tracking store rejects this job's writes (a trigger) while
    its member is killed: the pipeline restores all the same, the job reads UNKNOWN (not
    CLEAN), and the failure is surfaced as an event."""
    c = quiet
    job_id = submit(c, streaming(threshold=2))
    detail = wait_for(lambda: all_running(c, job_id), 30, what="the job to run")
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
        wait_for(lambda: all_running(c, job_id, restores=1), 30, what="the restore")
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
    """Seed acceptance 11 and 12: DIRTY while RUNNING; job.retry.times still decides (the
    second loss fails the job, as without the label); and the finished job's summary and
    episodes read exactly as they did while it ran."""
    c = quiet
    job_id = submit(c, streaming(threshold=1, retries=1))
    detail = wait_for(lambda: all_running(c, job_id), 30, what="the job to run")
    c.signal(next(iter(hosts(detail))), signal.SIGKILL)
    detail = wait_for(lambda: recovered(c, job_id, 1), 30, what="the recovery")
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
    detail = wait_for(lambda: all_running(c, other), 30, what="the second job to run")
    c.signal(next(iter(hosts(detail))), signal.SIGKILL)
    wait_for(lambda: all_running(c, other, restores=1), 30, what="its restore")
    assert dirty_task(c, other)["dirty"]
    c.restore()
    detail = wait_for(lambda: all_running(c, other), 30, what="running again")
    c.signal(next(iter(hosts(detail))), signal.SIGKILL)
    detail = wait_status(c, other, TERMINAL, timeout=30)
    assert detail["jobStatus"] == "FAILED" and "job.retry.times = 1" in detail["errorMsg"]
    assert detail["dirtyTask"]["dirty"] and detail["dirtyTask"]["evaluationStatus"] == "DIRTY"


def test_disabled_by_default_and_old_finished_records_stay_readable(quiet):
    """Seed acceptance 13: no option, no state; a finished job without a history record (as
    before this feature) reads DISABLED with every other field intact."""
    c = quiet
    job_id = submit(
        c,
        "env { job.mode = STREAMING }\nsource { FakeSource { rows.per-second = 10 } }\n"
        "sink { Blackhole {} }",
    )
    wait_for(lambda: all_running(c, job_id), 30, what="the job to run")
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
    """Seed acceptance 14: a worker announcing protocol 1 (a binary from before the feature)
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
        wait_for(lambda: all_running(c, disabled), 30, what="a disabled job to run")
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
    wait_for(lambda: all_running(c, job_id), 30, what="the enabled job to run")
    assert dirty_task(c, job_id)["evaluationStatus"] == "CLEAN"
    cancel(c, job_id)


def test_member_removal_stays_bounded_with_many_enabled_jobs(quiet):
    """Seed acceptance 15, on processes: 200 enabled jobs (PENDING: queued behind a job that
    holds every slot) and one running; a kill -9 is handled for all of them in the removal
    transaction: every watermark is up to date at once. (Timing: bench/member_loss.)"""
    c = quiet
    head = submit(c, streaming(pipelines=6, threshold=2))
    detail = wait_for(lambda: all_running(c, head), 30, what="the big job to run")
    queued = [submit(c, streaming(threshold=2)) for _ in range(200)]
    victim = next(iter(hosts(detail)))
    uuid = member_uuid(c, victim)
    c.signal(victim, signal.SIGKILL)
    wait_for(
        lambda: (
            c.one("SELECT state FROM engine_member WHERE uuid = %s::uuid", (uuid,)) == "REMOVED"
        ),
        10,
        what="the removal",
    )
    # Handled for every job in the removal transaction itself: the shared watermark is the
    # member-event sequence, and no job recorded a gap.
    assert c.one("SELECT dirty_handled_sequence = member_event_sequence FROM engine_clusterstate")
    assert c.one("SELECT count(*) FROM engine_dirtytrackinggap") == 0
    assert listed(c, queued[0])["evaluationStatus"] == "CLEAN"
    assert c.one("SELECT count(*) FROM engine_memberlossincident WHERE job_id = %s", (head,)) == 1
    assert (
        c.one("SELECT count(*) FROM engine_memberlossincident WHERE job_id = ANY(%s)", (queued,))
        == 0
    )
    for job_id in [head, *queued]:
        assert post(c, f"/api/v1/jobs/{job_id}/cancel")[0] == 202
    wait_for(
        lambda: (
            c.one(
                "SELECT count(*) FROM engine_job WHERE status NOT IN "
                "('CANCELED', 'FAILED', 'FINISHED')"
            )
            == 0
        ),
        60,
        what="every job to end",
    )
    assert c.one("SELECT count(*) FROM engine_dirtyjobstate") == 0
    assert (
        c.one("SELECT count(*) FROM history_jobhistory WHERE job_id = ANY(%s)", ([head, *queued],))
        == 201
    )
