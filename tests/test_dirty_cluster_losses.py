"""Dirty-job tracking on a live cluster: member losses and what each of them counts.

Real workers are killed (kill -9), frozen (SIGSTOP) or stopped (SIGTERM); the counts are read
through the REST contract (``dirtyTask``, filters, ``/episodes``).

The specification's acceptance criteria, and where each is shown: on processes in this module
(``losses``) and in tests/test_dirty_cluster_state.py (``state``); the same at the level of exact
interleavings in tests/test_dirty_counting.py (``counting``) and
tests/test_dirty_reconciliation.py (``reconciliation``):
- one episode, several pipelines, one attempt:
    losses: test_kill9_of_a_member_hosting_several_pipelines_counts_one_attempt
- a second deployment attempt counts once more:
    losses: test_a_failed_redeployment_then_another_counts_two
- duplicate member-removed / confirmation:
    losses: test_duplicate_member_removed_delivery_and_confirmation_change_nothing
- ordinary failures not counted:
    losses: test_ordinary_failures_are_not_counted_nor_consume_a_completed_episode
- preparation without DEPLOYING not counted:
    losses: test_a_pod_restart_is_unclassified_and_counted_once_deployment_starts (the PREPARED
    phase) and counting: test_restore_preparation_without_deploying_is_not_counted
- a completed episode not consumed:
    losses: test_ordinary_failures_are_not_counted_nor_consume_a_completed_episode
- pod restart UNCLASSIFIED, counted after deployment:
    losses: test_a_pod_restart_is_unclassified_and_counted_once_deployment_starts
- master change before/during confirmation:
    state: test_master_kill9_before_and_right_after_confirmation_counts_exactly_once
    and reconciliation: test_master_change_during_confirmation_confirms_once
- owner change keeps state (synchronous commit):
    state: test_state_survives_the_death_of_every_master
- missing state / lag / tracker failure UNKNOWN:
    state: test_a_tracker_failure_never_blocks_recovery_and_reads_unknown
    and reconciliation: test_missing_state_lagging_watermark_and_tracker_failure_are_unknown
- status and retries unchanged:
    state: test_the_threshold_changes_neither_status_nor_retries_and_finished_reads_the_same
- running and finished the same:
    state: test_the_threshold_changes_neither_status_nor_retries_and_finished_reads_the_same
- disabled by default, old records readable:
    state: test_disabled_by_default_and_old_finished_records_stay_readable
- mixed versions cannot enable:
    state: test_an_older_member_refuses_enabling_until_every_member_upgraded
- bounded member-removal processing:
    losses: test_member_removal_stays_bounded_with_many_enabled_jobs,
    reconciliation: test_member_removal_costs_the_same_statements_for_10_or_60_jobs
    and bench/member_loss
"""

from __future__ import annotations

import signal
import subprocess

import psycopg
import pytest

from tests.clusterkit import ROOT, Cluster, wait_for, wait_for_api
from tests.dirtyclusterkit import (
    all_running,
    cancel,
    dirty_cluster,
    dirty_task,
    episodes,
    hosts,
    listed,
    member_uuid,
    quiet,
    recovered,
    streaming,
)
from tests.test_jobs_cluster import TERMINAL, data_db, job, post, submit, wait_status

__all__ = ["data_db", "dc", "quiet"]

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def dc(db_template):
    """The dirty tests' cluster with one master: no test here hurts a master."""
    with dirty_cluster(db_template, masters=1) as c:
        yield c


def test_kill9_of_a_member_hosting_several_pipelines_counts_one_attempt(quiet):
    """One member-loss episode affecting multiple pipelines counts one
    first-generation job attempt (not one per pipeline or task group)."""
    c = quiet
    job_id = submit(c, streaming(pipelines=3, threshold=2))
    detail = wait_for_api(lambda: all_running(c, job_id), 30, what="the job to run")
    assert detail["dirtyTask"]["evaluationStatus"] == "CLEAN"
    victim, affected = max(hosts(detail).items(), key=lambda kv: len(kv[1]))
    assert len(affected) >= 2
    uuid = member_uuid(c, victim)
    c.signal(victim, signal.SIGKILL)
    detail = wait_for_api(lambda: recovered(c, job_id, 1), 30, what="the recovery to complete")
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
    """The first redeployment lands partly on a member that froze (SIGSTOP)
    and is removed before it runs; the second deployment advances the count exactly once more,
    in the same episode."""
    c = slow_heartbeat
    job_id = submit(c, streaming(threshold=2, retries=5, interval=2))
    detail = wait_for_api(lambda: all_running(c, job_id), 30, what="the job to run")
    used = set(hosts(detail))
    names = [p["name"] for p in c.status() if p["kind"] == "worker"]
    idle = next(n for n in names if n not in used)
    victim = sorted(used)[0]
    c.signal(idle, signal.SIGSTOP)  # ALIVE for 12 s more: it gets a slot, never runs it
    c.signal(victim, signal.SIGKILL)
    try:
        wait_for_api(
            lambda: (
                dirty_task(c, job_id)["recoveryAttemptCount"] == 1 and idle in hosts(job(c, job_id))
            ),
            20,
            what="the first redeployment (partly on the frozen member)",
        )
        detail = wait_for_api(
            lambda: all_running(c, job_id, restores=2), 40, what="the second redeployment"
        )
    finally:
        c.signal(idle, signal.SIGCONT)
    d = wait_for_api(lambda: recovered(c, job_id, 1), 20, what="the episode to complete")[
        "dirtyTask"
    ]
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
    """After a kill -9 recovery, another process delivers
    the same member-removed event and the same confirmations again: no change."""
    c = quiet
    job_id = submit(c, streaming(pipelines=2))
    detail = wait_for_api(lambda: all_running(c, job_id), 30, what="the job to run")
    victim = next(iter(hosts(detail)))
    uuid = member_uuid(c, victim)
    c.signal(victim, signal.SIGKILL)
    wait_for_api(lambda: recovered(c, job_id, 1), 30, what="the recovery")
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
    """A job recovers from a kill -9 (episode COMPLETED, count 1);
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
        "source { FakeSource { rows.per-second = 200, endless = true,\n"
        "                      schema { fields { id = bigint, name = string } } } }\n"
        f'sink {{ Jdbc {{ url = "{url}", user = root, password = t, table = t }} }}\n',
    )
    detail = wait_for_api(lambda: all_running(c, job_id), 30, what="the job to run")
    c.signal(next(iter(hosts(detail))), signal.SIGKILL)
    wait_for_api(lambda: recovered(c, job_id, 1), 30, what="the recovery")
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
    """A worker stopped by SIGTERM (as Kubernetes does on a pod
    restart, without trusted planned-leave intent) leaves gracefully; its incident is
    UNCLASSIFIED, and nothing counts until the restored pipeline reaches DEPLOYING."""
    c = quiet
    job_id = submit(c, streaming(threshold=2, interval=3))
    detail = wait_for_api(lambda: all_running(c, job_id), 30, what="the job to run")
    leaver = next(iter(hosts(detail)))
    c.signal(leaver, signal.SIGTERM)
    d = wait_for_api(
        lambda: (d := dirty_task(c, job_id))["memberLossIncidentCount"] == 1 and d,
        10,
        what="the incident",
    )
    # Prepared (restore requested, due in 3 s) but not deployed: not counted.
    wait_for_api(
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
    d = wait_for_api(lambda: recovered(c, job_id, 1), 30, what="the recovery")["dirtyTask"]
    assert d["recoveryAttemptCount"] == 1
    assert episodes(c, job_id)[0]["incidents"][0]["classification"] == "UNCLASSIFIED"
    c.start(leaver)  # the pod comes back as a new member
    cancel(c, job_id)


def submit_many(c: Cluster, count: int) -> list[int]:
    """``count`` one-pipeline streaming jobs of threshold 2 in one request (SeaTunnel's
    ``/submit-jobs``, one transaction): their ids."""
    config = {
        "env": {
            "job.mode": "STREAMING",
            "parallelism": 1,
            "job.retry.times": 3,
            "job.retry.interval.seconds": 0,
            "job.dirty-task.threshold": 2,
        },
        "source": [
            {
                "plugin_name": "FakeSource",
                "plugin_output": "s0",
                "rows.per-second": 50,
                "endless": True,
            }
        ],
        "sink": [{"plugin_name": "Blackhole", "plugin_input": "s0"}],
    }
    # Planning 200 jobs in one request took over 30 s on a slow day of this machine.
    code, body = c.post("/submit-jobs", [config] * count, timeout=120)
    assert code == 200 and len(body) == count, body
    return [int(j["jobId"]) for j in body]


def test_member_removal_stays_bounded_with_many_enabled_jobs(quiet):
    """200 enabled jobs (PENDING: queued behind a job that
    holds every slot) and one running; a kill -9 is handled for all of them in the removal
    transaction: every watermark is up to date at once. (Timing: bench/member_loss.)"""
    c = quiet
    head = submit(c, streaming(pipelines=6, threshold=2))
    detail = wait_for_api(lambda: all_running(c, head), 30, what="the big job to run")
    queued = submit_many(c, 200)
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
    code, stopped = post(c, "/stop-jobs", [{"jobId": j} for j in [head, *queued]])
    assert code == 200 and len(stopped) == 201, stopped
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
