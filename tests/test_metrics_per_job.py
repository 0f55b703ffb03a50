"""Per-job series on ``GET /metrics``: a job holding slots carries its rows, checkpoints,
restores and DIRTY flag (rows that do not fall when a restore starts its attempts over), in as
many queries for ten jobs as for one, and its series leave when it ends; ended jobs are counted
by status and the count never falls when retention deletes them."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from engine import counters
from engine.jobs import cleanup, terminal
from engine.models import Job, JobCleanupRecord, MetricTotal, Pipeline, TaskGroup
from engine.states import CleanupKind, JobStatus
from tests.dirtykit import host_of_both_pipelines, running_job
from tests.test_metrics import scrape, value

pytestmark = pytest.mark.django_db(transaction=True)


def job_series(samples, job) -> dict[str, float]:
    """The job's per-job samples, by name (and state for checkpoints); keel_job_evaluation,
    the older per-job gauge of tracked jobs, aside."""
    out = {}
    for (name, labels), sample in samples.items():
        labels = dict(labels)
        if labels.get("job_id") == str(job.id) and name != "keel_job_evaluation":
            state = labels.get("state")
            out[f"{name}:{state}" if state else name] = sample
    return out


def count_rows(job, read: int, written: int) -> None:
    """Each live reader attempt reports these counts (as its progress report would)."""
    TaskGroup.objects.filter(job=job, kind="READER").update(
        source_received=read, sink_written=written
    )


def test_a_running_job_carries_its_series_across_a_restore_until_it_ends(engine, client):
    job, _ = running_job(engine, members=4, threshold=1)
    count_rows(job, read=500, written=400)
    Pipeline.objects.filter(job=job).update(checkpoints_completed=3, checkpoints_failed=1)
    series = job_series(scrape(client), job)
    assert series == {
        "keel_job_rows_read_total": 1000,  # two pipelines, a reader each
        "keel_job_rows_written_total": 800,
        "keel_job_checkpoints_total:completed": 6,
        "keel_job_checkpoints_total:failed": 2,
        "keel_job_restores_total": 0,
        "keel_job_dirty": 0,
    }

    engine.lose(host_of_both_pipelines(engine, job))
    engine.settle()
    assert TaskGroup.objects.filter(job=job, kind="READER", source_received=0).count() == 2
    series = job_series(scrape(client), job)
    # The restored attempts start their counts over; the job's counters do not go back.
    assert series["keel_job_rows_read_total"] == 1000
    assert series["keel_job_rows_written_total"] == 800
    assert series["keel_job_restores_total"] == 2
    assert series["keel_job_dirty"] == 1  # threshold 1: one recovery attempt turns it DIRTY
    count_rows(job, read=50, written=40)
    series = job_series(scrape(client), job)
    assert series["keel_job_rows_read_total"] == 1100
    assert series["keel_job_rows_written_total"] == 880

    engine.cancel(job)
    assert Job.objects.get(id=job.id).status == JobStatus.CANCELED
    ended = scrape(client)
    assert job_series(ended, job) == {}
    assert value(ended, "keel_jobs_ended_total", status="CANCELED") == 1
    # Its own totals go with its running state.
    record = JobCleanupRecord.objects.get(job_id=job.id, kind=CleanupKind.JOB_STATE)
    JobCleanupRecord.objects.filter(id=record.id).update(due_at=record.created_at)
    assert cleanup.execute(record.id) == "done"
    assert not MetricTotal.objects.filter(name__in=counters.PER_JOB).exists()


def test_a_scrape_costs_as_many_queries_for_ten_jobs_as_for_one(engine, client):
    for _ in range(5):  # 40 slots: ten jobs of 4
        engine.add_member(slots=8)
    engine.submit()
    engine.schedule()
    engine.run_deployed()
    with CaptureQueriesContext(connection) as one:
        first = scrape(client)
    for _ in range(9):
        engine.submit()
    engine.schedule()
    engine.run_deployed()
    with CaptureQueriesContext(connection) as ten:
        samples = scrape(client)
    jobs = {dict(labels)["job_id"] for name, labels in samples if name == "keel_job_dirty"}
    assert len(jobs) == 10 and len({n for n, _ in first if n == "keel_job_dirty"}) == 1
    assert len(ten.captured_queries) == len(one.captured_queries)


def test_ended_jobs_are_counted_once_and_never_fall_with_retention(engine, client):
    canceled, _ = running_job(engine, members=2)
    engine.cancel(canceled)
    failed = engine.submit()
    engine.add_member()
    engine.schedule()
    engine.run_deployed()
    engine.ordinary_failure(failed)
    engine.stop_failing()
    assert Job.objects.get(id=failed.id).status == JobStatus.FAILED
    # The terminal transition code running again on an ended job counts nothing.
    with transaction.atomic():
        again = Job.objects.select_for_update().get(id=canceled.id)
        terminal.end_job(again, JobStatus.CANCELED)
    before = scrape(client)
    assert value(before, "keel_jobs", status="CANCELED") == 1
    assert value(before, "keel_jobs_ended_total", status="CANCELED") == 1
    assert value(before, "keel_jobs_ended_total", status="FAILED") == 1
    assert value(before, "keel_jobs_ended_total", status="FINISHED") == 0

    # Retention: each job's running state, then the job and its history, are deleted.
    for kind in (CleanupKind.JOB_STATE, CleanupKind.HISTORY):
        for record in JobCleanupRecord.objects.filter(kind=kind):
            JobCleanupRecord.objects.filter(id=record.id).update(due_at=record.created_at)
            assert cleanup.execute(record.id) == "done", record
    assert not Job.objects.exists()
    after = scrape(client)
    assert value(after, "keel_jobs", status="CANCELED") == 0
    assert value(after, "keel_jobs", status="FAILED") == 0
    assert value(after, "keel_jobs_ended_total", status="CANCELED") == 1
    assert value(after, "keel_jobs_ended_total", status="FAILED") == 1
