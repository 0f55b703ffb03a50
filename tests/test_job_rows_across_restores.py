"""A job's rows read and written never fall when a restore starts its task groups' counts over:
the job's detail (``metrics``), SeaTunnel's running-jobs list, the cluster page's recent jobs
and the job page add the rows of the replaced attempts (counters.PER_JOB), read with the jobs
in their own query; the finished-job record keeps them, so the detail reads the same once the
job's running state and its totals are cleaned up."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from engine import counters
from engine.jobs import cleanup
from engine.models import Job, JobCleanupRecord, MetricTotal, TaskGroup
from engine.states import CleanupKind, JobStatus
from tests.conftest import role_user
from tests.dirtykit import host_of_both_pipelines, running_job
from tests.test_metrics_per_job import count_rows

pytestmark = pytest.mark.django_db(transaction=True)


def counts(api, job) -> tuple[int, int]:
    metrics = api.get(f"/api/v1/jobs/{job.id}").json()["metrics"]
    return metrics["sourceReceivedCount"], metrics["sinkWriteCount"]


def test_the_rows_of_a_job_do_not_fall_after_a_restore_nor_after_cleanup(engine, api, client):
    job, _ = running_job(engine, members=4, threshold=5)
    count_rows(job, read=500, written=400)
    assert counts(api, job) == (1000, 800)  # two pipelines, a reader each

    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    assert TaskGroup.objects.filter(job=job, kind="READER", source_received=0).count() == 2
    assert counts(api, job) == (1000, 800)
    count_rows(job, read=50, written=40)
    assert counts(api, job) == (1100, 880)
    seatunnel = api.get(f"/job-info/{job.id}").json()["metrics"]
    assert (seatunnel["SourceReceivedCount"], seatunnel["SinkWriteCount"]) == ("1100", "880")
    client.force_login(role_user("vera", "viewer"))
    cluster = client.get("/").content.decode()
    row = re.search(rf'<a href="/jobs/{job.id}/">{job.id}</a>.*?</tr>', cluster, re.S)[0]
    assert "<td>1100</td><td>880</td>" in row
    job_page = client.get(f"/jobs/{job.id}/").content.decode()
    assert "1100 rows read, 880 written" in job_page

    engine.cancel(job)
    assert Job.objects.get(id=job.id).status == JobStatus.CANCELED
    # The finished-job record was written with them before the totals could go.
    record = JobCleanupRecord.objects.get(job_id=job.id, kind=CleanupKind.JOB_STATE)
    JobCleanupRecord.objects.filter(id=record.id).update(due_at=record.created_at)
    assert cleanup.execute(record.id) == "done"
    assert not MetricTotal.objects.filter(name__in=counters.PER_JOB).exists()
    assert not TaskGroup.objects.filter(job=job).exists()
    assert counts(api, job) == (1100, 880)
    assert "1100 rows read, 880 written" in client.get(f"/jobs/{job.id}/").content.decode()


def test_a_list_of_jobs_reads_their_replaced_rows_in_no_query_more(engine, api):
    """SeaTunnel's running-jobs list: as many queries for three jobs as for one."""
    for _ in range(3):
        engine.add_member(slots=8)
    first = engine.submit()
    engine.schedule()
    engine.run_deployed()
    counters.bump([(counters.JOB_ROWS_READ_RETIRED, str(first.id), 70)])
    api.get("/running-jobs")  # the caller's permissions, read once
    with CaptureQueriesContext(connection) as one:
        listed = api.get("/running-jobs").json()
    assert [j["metrics"]["sourceReceivedCount"] for j in listed] == ["70"]
    for _ in range(2):
        engine.submit()
    engine.schedule()
    engine.run_deployed()
    with CaptureQueriesContext(connection) as three:
        listed = api.get("/running-jobs").json()
    assert len(listed) == 3
    assert len(three.captured_queries) == len(one.captured_queries)
