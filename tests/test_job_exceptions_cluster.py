"""A job's exception history on a real cluster: a worker killed with -9 under a streaming job
leaves an entry naming it and the attempt it lost, which the restore followed; a plugin's
error reaches the history with the worker's traceback of it."""

from __future__ import annotations

import signal

import pytest

from tests.clusterkit import wait_for
from tests.test_jobs_cluster import TERMINAL, job, submit, wait_status

pytestmark = pytest.mark.cluster


def exceptions(c, job_id: int) -> list[dict]:
    code, body = c.api(f"/api/v1/jobs/{job_id}/exceptions")
    assert code == 200, body
    return body


def test_a_killed_readers_worker_is_in_the_history_as_lost_and_restored(healthy):
    job_id = submit(
        healthy,
        "env { job.mode = STREAMING, parallelism = 1, job.retry.interval.seconds = 0 }\n"
        "source { FakeSource { rows.per-second = 50, endless = true } }\n"
        "sink { Blackhole {} }",
    )
    detail = wait_status(healthy, job_id, {"RUNNING"}, timeout=30)
    reader = next(g for g in detail["pipelines"][0]["taskGroups"] if g["kind"] == "READER")
    victim = reader["member"]
    assert exceptions(healthy, job_id) == []
    healthy.signal(victim["name"], signal.SIGKILL)

    def lost_entry() -> dict | None:
        return next(
            (
                e
                for e in exceptions(healthy, job_id)
                if e["taskGroupId"] == reader["taskGroupId"] and e["causedRestore"]
            ),
            None,
        )

    entry = wait_for(lost_entry, 30, interval=0.2, what="the lost reader to be in the history")
    assert entry["memberName"] == victim["name"] and entry["member"] == victim
    assert entry["attempt"] == reader["attempt"] and entry["taskGroup"] == "reader 0"
    assert entry["memberLost"] is True and victim["name"] in entry["error"]
    wait_for(
        lambda: job(healthy, job_id)["pipelines"][0]["restoreCount"] == 1,
        30,
        what="the pipeline to be restored",
    )
    code, _ = healthy.post(f"/api/v1/jobs/{job_id}/cancel")
    assert code == 202
    wait_status(healthy, job_id, TERMINAL, timeout=30)


def test_a_plugins_error_is_in_the_history_with_its_traceback(healthy):
    job_id = submit(
        healthy,
        "env { parallelism = 1 }\n"
        "source { FakeSource { row.num = 50 } }\n"
        'transform { RowFilter { field = id, op = ">", value = "not-a-number" } }\n'
        "sink { Console { } }",
    )
    assert wait_status(healthy, job_id, TERMINAL, timeout=30)["jobStatus"] == "FAILED"
    (entry,) = wait_for(lambda: exceptions(healthy, job_id), 10, what="the failure recorded")
    assert entry["taskGroup"] == "reader 0" and entry["memberLost"] is False
    assert "transform[0].RowFilter" in entry["error"] and not entry["causedRestore"]
    assert entry["traceback"].startswith("Traceback (most recent call last):")
    assert "invalid literal for int()" in entry["traceback"].splitlines()[-1]
    assert "PluginFailure" not in entry["traceback"]  # the plugin's own error, not its wrapper
