"""A planned leave beside a crash, on a live cluster of real processes: one job's worker is
drained with ``./run cluster drain`` (through the authenticated API), another job's worker is
killed with SIGKILL. Both jobs run on elsewhere and finish with exactly their rows; at threshold
1 the drained one stays CLEAN and the killed one turns DIRTY. The drained worker leaves LEFT and
its process exits 0; the audit names who drained it and why."""

from __future__ import annotations

import signal
import textwrap
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.clusterkit import Cluster, wait_for
from tests.dirtyclusterkit import hosts
from tests.test_jobs_cluster import TERMINAL, job, submit, wait_status

pytestmark = pytest.mark.cluster

ROWS = 1500


def batch(out, threshold: int = 1) -> str:
    return textwrap.dedent(f"""
        env {{ job.mode = BATCH, parallelism = 1, job.retry.times = 1,
              job.retry.interval.seconds = 0, job.dirty-task.threshold = {threshold} }}
        source {{ FakeSource {{ row.num = {ROWS}, split.num = 1, rows.per-second = 150,
                               schema {{ fields {{ id = bigint, name = string }} }} }} }}
        sink {{ LocalFile {{ path = "{out}", file_format_type = csv }} }}
    """)


def ids(out) -> list[int]:
    return sorted(
        int(line.split(",")[0])
        for part in out.glob("part-*.csv")
        for line in part.read_text().splitlines()
    )


def scrape(c: Cluster) -> dict[str, float]:
    """The cluster's /metrics as prometheus_client parses it (unlabelled and summed samples)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{c.port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(f",{k}={v}" for k, v in sorted(sample.labels.items()))
            out[key] = sample.value
    return out


def reading(c: Cluster, job_id: int) -> bool:
    detail = job(c, job_id)
    return detail["jobStatus"] == "RUNNING" and all(
        g["metrics"]["sourceReceivedCount"] > 0 or g["kind"] == "ENUMERATOR"
        for g in detail["pipelines"][0]["taskGroups"]
    )


def test_a_drained_workers_job_stays_clean_and_a_killed_workers_turns_dirty(db_template, tmp_path):
    with Cluster(db_template, masters=1, workers=4, slots=2, heartbeat_timeout=3.0) as c:
        drained_out, killed_out = tmp_path / "drained", tmp_path / "killed"
        drained_job = submit(c, batch(drained_out))
        killed_job = submit(c, batch(killed_out))
        for job_id in (drained_job, killed_job):
            wait_for(lambda j=job_id: reading(c, j), 30, interval=0.1, what="the job to read")
        on_drained, on_killed = hosts(job(c, drained_job)), hosts(job(c, killed_job))
        to_drain = next(m for m in on_drained if m not in on_killed)
        before = scrape(c)

        drained = c.cli("cluster", "drain", to_drain, "--reason", "kernel upgrade", timeout=120)
        assert f"drain of {to_drain} LEFT" in drained.stdout, drained.stdout
        on_killed = hosts(job(c, killed_job))
        to_kill = next(m for m in on_killed if m not in hosts(job(c, drained_job)))
        c.signal(to_kill, signal.SIGKILL)
        # The counters move as the worker dies (scraped over HTTP from the web process).
        wait_for(
            lambda: scrape(c)["keel_restores_total,cause=member_loss"] >= 1,
            30,
            interval=0.2,
            what="the member-loss restore to be counted",
        )
        moved = scrape(c)
        assert moved["keel_member_events_total"] == before["keel_member_events_total"] + 2
        assert moved["keel_members,state=REMOVED"] == before["keel_members,state=REMOVED"] + 1
        assert moved["keel_members,state=LEFT"] == before["keel_members,state=LEFT"] + 1
        assert moved["keel_restores_total,cause=planned"] >= 1
        assert moved["keel_drains,state=LEFT"] == 1

        for job_id, out in ((drained_job, drained_out), (killed_job, killed_out)):
            detail = wait_status(c, job_id, TERMINAL, timeout=120)
            assert detail["jobStatus"] == "FINISHED", detail["errorMsg"]
            assert ids(out) == list(range(ROWS)), f"job {job_id} lost or doubled rows"
        clean, dirty = job(c, drained_job), job(c, killed_job)
        assert clean["pipelines"][0]["restoreCount"] == 1
        assert clean["dirtyTask"]["evaluationStatus"] == "CLEAN"
        assert clean["dirtyTask"]["recoveryAttemptCount"] == 0
        assert clean["dirtyTask"]["lastLeaveClassification"] == "PLANNED_VERIFIED"
        assert dirty["dirtyTask"]["evaluationStatus"] == "DIRTY"
        assert dirty["dirtyTask"]["recoveryAttemptCount"] == 1
        ended = scrape(c)
        assert ended["keel_dirty_transitions_total"] == 1
        assert ended["keel_recovery_attempts_total"] == 1
        assert ended["keel_rows_read_total"] >= 2 * ROWS
        assert ended["keel_jobs,status=FINISHED"] == 2

        # The drained member left as planned, its process ended on its own, and the audit
        # says who drained it and why.
        state, uuid = c.query(
            "SELECT state, uuid::text FROM engine_member WHERE name = %s ORDER BY id DESC",
            (to_drain,),
        )[0]
        assert state == "LEFT"
        wait_for(lambda: not c.alive(to_drain), 15, what="the drained worker to exit")
        assert "was drained and left the cluster" in c.log(to_drain)
        code, drains = c.api(f"/api/v1/members/{uuid}/drain")
        assert code == 200 and drains[0]["state"] == "LEFT"
        assert drains[0]["requestedBy"] == "admin" and drains[0]["reason"] == "kernel upgrade"
        assert drains[0]["movedTaskGroups"] >= 1
