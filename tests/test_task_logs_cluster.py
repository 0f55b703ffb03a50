"""A job's Console rows, printed on a worker, read back through the web's API with the task
group that printed them (engine.member.tasklogs, engine.member.tasklog_shipping)."""

from __future__ import annotations

import pytest

from tests.clusterkit import run_batch_job, wait_for

pytestmark = pytest.mark.cluster

ROWS = 4
CONSOLE_JOB = f"""
env {{ job.mode = BATCH, parallelism = 2 }}
source {{ FakeSource {{ row.num = {ROWS}, schema {{ fields {{ id = bigint, name = string }} }} }} }}
sink {{ Console {{ }} }}
"""


def test_console_rows_appear_in_the_api_under_the_reader_that_printed_them(healthy):
    job_id = run_batch_job(healthy, CONSOLE_JOB, "a Console job")
    readers = {
        group: member
        for group, member in healthy.query(
            "SELECT id, member_id FROM engine_taskgroup WHERE job_id = %s AND kind = 'READER'",
            (job_id,),
        )
    }
    assert len(readers) == 2

    def console_lines() -> list[dict]:
        code, body = healthy.api(f"/api/v1/jobs/{job_id}/logs?level=info")
        assert code == 200, body
        return [line for line in body["results"] if line["logger"] == "keel.sink.console"]

    lines = wait_for(
        lambda: len(found := console_lines()) >= 2 * ROWS and found,
        15,
        interval=0.2,
        what="the Console rows in the job's logs",
    )
    assert len(lines) == 2 * ROWS
    for group in readers:
        mine = [line for line in lines if line["taskGroupId"] == group]
        assert len(mine) == ROWS, lines
        assert all(line["level"] == "INFO" and "'id':" in line["message"] for line in mine)
    code, body = healthy.api(f"/api/v1/jobs/{job_id}/logs?taskGroup={next(iter(readers))}")
    assert code == 200
    assert {line["taskGroupId"] for line in body["results"]} == {next(iter(readers))}
