"""Terminal-state cleanup on real PostgreSQL, step by step: the record written in the job's
terminal transaction, execution exactly once however many deliveries race, the detail read
the same before and after, late callbacks as no-ops, a wait for the history that spends no
attempt, real failures retried then FAILED, the countdown hint and its switch, the REST view
and the admin console."""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta

import pytest
import redis
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from engine.jobs import checkpoints, cleanup, lifecycle, splits
from engine.models import (
    Checkpoint,
    Job,
    JobCleanupRecord,
    Pipeline,
    SplitAssignment,
    TaskCheckpoint,
    TaskGroup,
)
from history.models import JobHistory

pytestmark = pytest.mark.django_db(transaction=True)

JOB = """
env { job.mode = STREAMING, parallelism = 2, checkpoint.interval = 60000 }
source { FakeSource { } }
sink { Blackhole { } }
"""


def ended_job(engine, config: str = JOB) -> Job:
    """A job that ran (splits assigned, a checkpoint completed) and was cancelled."""
    engine.add_member(slots=8)
    job = engine.submit(config=config)
    engine.schedule()
    engine.run_deployed()
    pipeline = Pipeline.objects.get(job=job)
    assert splits.assign(
        pipeline.id, [{"splitId": "a"}, {"splitId": "b"}], readers=2, owned=lambda: True
    )
    groups = list(TaskGroup.objects.filter(job=job))
    checkpoint = Checkpoint.objects.create(
        job=job, pipeline=pipeline, expected={str(g.id): g.attempt for g in groups}
    )
    for group in groups:
        assert checkpoints.acknowledge(checkpoint.id, group.id, group.attempt, {"splits": {}})
    checkpoints.complete_or_expire(engine.epoch)
    for group in groups:
        lifecycle.report_metrics(group.id, group.attempt, group.member_id, 100, 90, 12.5)
    engine.cancel(job)
    job.refresh_from_db()
    assert job.status == "CANCELED"
    return job


def make_due(job: Job) -> JobCleanupRecord:
    JobCleanupRecord.objects.filter(job_id=job.id).update(
        due_at=timezone.now() - timedelta(seconds=1)
    )
    return JobCleanupRecord.objects.get(job_id=job.id, kind="JOB_STATE")


def running_state(job: Job) -> dict:
    return {
        "pipelines": Pipeline.objects.filter(job=job).count(),
        "taskGroups": TaskGroup.objects.filter(job=job).count(),
        "checkpoints": Checkpoint.objects.filter(job=job).count(),
        "acks": TaskCheckpoint.objects.filter(checkpoint__job=job).count(),
        "splits": SplitAssignment.objects.filter(pipeline__job=job).count(),
    }


def test_the_terminal_transaction_writes_the_record_and_the_detail_reads_the_same_after(
    engine, api, settings
):
    settings.ENGINE = {**settings.ENGINE, "job-state-cleanup-delay": 60.0}
    job = ended_job(engine)
    record = JobCleanupRecord.objects.get(job_id=job.id)
    assert (record.kind, record.state, record.job_name) == ("JOB_STATE", "PENDING", job.name)
    assert abs((record.due_at - job.finished_at).total_seconds() - 60) < 0.01
    assert JobHistory.objects.get(job=job).summary["metrics"]["sourceReceivedCount"] == 300
    # Not due: the running state stays for late callbacks.
    assert cleanup.execute(record.id) == "not due yet"
    assert running_state(job)["taskGroups"] == 3

    before = api.get(f"/api/v1/jobs/{job.id}").json()
    listed_before = api.get("/api/v1/jobs?jobStatus=CANCELED").json()["results"]
    assert before["cleanup"]["state"] == "PENDING"
    assert cleanup.execute(make_due(job).id) == "done"
    assert running_state(job) == dict.fromkeys(running_state(job), 0)
    after = api.get(f"/api/v1/jobs/{job.id}").json()
    assert after["cleanup"]["state"] == "DONE" and after["cleanup"]["executedAt"]
    before.pop("cleanup"), after.pop("cleanup")
    assert after == before
    assert api.get("/api/v1/jobs?jobStatus=CANCELED").json()["results"] == listed_before
    record.refresh_from_db()
    assert (record.state, record.attempts, record.executions) == ("DONE", 1, 1)
    # Its history record is scheduled for engine.history.retention after the job's end.
    history = JobCleanupRecord.objects.get(job_id=job.id, kind="HISTORY")
    assert history.state == "PENDING" and history.due_at > job.finished_at + timedelta(days=6)

    listed = api.get(f"/api/v1/cleanup-records?jobId={job.id}").json()
    assert {r["kind"] for r in listed["results"]} == {"JOB_STATE", "HISTORY"}
    assert api.get("/api/v1/cleanup-records?state=DONE").json()["count"] == 1
    assert set(listed["results"][0]) == {
        "jobId",
        "jobName",
        "kind",
        "state",
        "dueAt",
        "createdAt",
        "executedAt",
        "attempts",
        "lastError",
    }


def test_racing_deliveries_execute_a_record_once(engine):
    job = ended_job(engine)
    record = make_due(job)
    barrier = threading.Barrier(6)
    results = []

    def deliver():
        barrier.wait()
        try:
            results.append(cleanup.execute(record.id))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deliver) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    record.refresh_from_db()
    assert results.count("done") == 1, results
    assert (record.state, record.executions) == ("DONE", 1)


def test_late_callbacks_after_the_tombstone_and_after_cleanup_are_quiet_no_ops(engine, caplog):
    job = ended_job(engine)
    groups = list(TaskGroup.objects.filter(job=job).values_list("id", "attempt", "member_id"))
    pipeline_id = Pipeline.objects.get(job=job).id
    checkpoint_id = Checkpoint.objects.filter(job=job).values_list("id", flat=True).first()

    def late_callbacks() -> list:
        answers = []
        for group_id, attempt, member_id in groups:
            answers += [
                lifecycle.mark_running(group_id, attempt, member_id),
                lifecycle.report_metrics(group_id, attempt, member_id, 9999, 9999, 1.0),
                lifecycle.mark_input_ended(group_id, attempt, member_id),
                lifecycle.finish_task_group(group_id, attempt, member_id, "FINISHED"),
                # A new snapshot is never recorded (the same attempt's earlier ack of this
                # checkpoint answers True while it exists: nothing changes either way).
                checkpoints.acknowledge(checkpoint_id, group_id, attempt, {"late": True})
                and TaskCheckpoint.objects.filter(state={"late": True}).exists(),
                splits.record_offsets(
                    splits.Reader(group_id, attempt, member_id), pipeline_id, {"a": 5}
                ),
            ]
            checkpoints.record_commit(checkpoint_id, group_id, attempt)
        return answers

    caplog.set_level(logging.INFO)
    history = JobHistory.objects.get(job=job).summary
    assert not any(late_callbacks())  # tombstoned: nothing counted
    assert JobHistory.objects.get(job=job).summary == history
    cleanup.execute(make_due(job).id)
    assert not any(late_callbacks())  # cleaned: nothing recreated
    assert running_state(job) == dict.fromkeys(running_state(job), 0)
    assert Job.objects.get(id=job.id).status == "CANCELED"
    assert not [r for r in caplog.records if r.levelno > logging.INFO], [
        r.getMessage() for r in caplog.records if r.levelno > logging.INFO
    ]


def waits_for(record: JobCleanupRecord) -> float:
    """How long from now the sweep leaves a record before sending it again (seconds)."""
    record.refresh_from_db()
    resend_at = record.enqueued_at + cleanup.REENQUEUE_AFTER
    return (resend_at - checkpoints.database_now()).total_seconds()


def test_a_record_waiting_for_its_history_waits_and_spends_no_attempt(engine, api, settings):
    """Waiting is not failing: executed more often than max-attempts before the history is
    written, the record stays PENDING and due (counted overdue: a wait that never ends shows),
    spends no attempt, says why in lastError and is sent again after a short bounded wait."""
    settings.ENGINE = {**settings.ENGINE, "job-state-cleanup.max-attempts": 3}
    job = ended_job(engine)
    summary = JobHistory.objects.get(job=job).summary
    JobHistory.objects.filter(job=job).update(summary=None)  # not written yet
    record = make_due(job)
    why = f"waiting: the history record of job {job.id} is not written yet"
    for _ in range(5):
        assert cleanup.execute(record.id) == why
        waiting = JobCleanupRecord.objects.get(id=record.id)
        assert (waiting.state, waiting.attempts, waiting.last_error) == ("PENDING", 0, why)
        assert waiting.due_at == record.due_at
    assert running_state(job)["taskGroups"] == 3  # nothing removed
    assert cleanup.overdue_count() == 1
    listed = api.get(f"/api/v1/cleanup-records?jobId={job.id}").json()["results"][0]
    assert (listed["state"], listed["attempts"], listed["lastError"]) == ("PENDING", 0, why)

    # Due a second ago, it is sent again in about a second; the sweep leaves it until then.
    assert cleanup.WAIT_MIN - 0.5 < waits_for(record) <= cleanup.WAIT_MIN + 1
    with transaction.atomic():
        assert cleanup.claim_due() == []
    JobCleanupRecord.objects.filter(id=record.id).update(
        enqueued_at=F("enqueued_at") - timedelta(seconds=cleanup.WAIT_MIN + 1)
    )
    with transaction.atomic():
        assert cleanup.claim_due() == [record.id]
    # Waiting for an hour, it is looked at again within WAIT_MAX, not later.
    JobCleanupRecord.objects.filter(id=record.id).update(due_at=Now() - timedelta(hours=1))
    assert cleanup.execute(record.id) == why
    assert cleanup.WAIT_MAX - 1 < waits_for(record) <= cleanup.WAIT_MAX

    JobHistory.objects.filter(job=job).update(summary=summary)
    assert cleanup.execute(record.id) == "done"
    record.refresh_from_db()
    assert (record.state, record.attempts, record.executions, record.last_error) == (
        "DONE",
        1,
        1,
        "",
    )


@pytest.fixture
def failing_removal():
    """A real failure of the removal: a trigger refuses to delete the chosen jobs' pipelines."""
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE test_cleanup_fault (job_id bigint)")
        cur.execute(
            """
            CREATE FUNCTION test_cleanup_fault() RETURNS trigger AS $$
            BEGIN
              IF EXISTS (SELECT 1 FROM test_cleanup_fault WHERE job_id = OLD.job_id) THEN
                RAISE EXCEPTION 'injected failure removing the pipelines of job %', OLD.job_id;
              END IF;
              RETURN OLD;
            END $$ LANGUAGE plpgsql
            """
        )
        cur.execute(
            "CREATE TRIGGER test_cleanup_fault BEFORE DELETE ON engine_pipeline"
            " FOR EACH ROW EXECUTE FUNCTION test_cleanup_fault()"
        )

    def fail(job: Job, on: bool = True) -> None:
        with connection.cursor() as cur:
            if on:
                cur.execute("INSERT INTO test_cleanup_fault VALUES (%s)", [job.id])
            else:
                cur.execute("DELETE FROM test_cleanup_fault")

    yield fail
    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER test_cleanup_fault ON engine_pipeline")
        cur.execute("DROP FUNCTION test_cleanup_fault()")
        cur.execute("DROP TABLE test_cleanup_fault")


def test_real_failures_spend_attempts_with_backoff_then_fail_and_can_be_retried(
    engine, settings, failing_removal
):
    settings.ENGINE = {**settings.ENGINE, "job-state-cleanup.max-attempts": 3}
    job = ended_job(engine)
    failing_removal(job)
    summary = JobHistory.objects.get(job=job).summary
    for attempt in (1, 2, 3):
        record = make_due(job)
        before = checkpoints.database_now()
        assert cleanup.execute(record.id).startswith("failed")
        record.refresh_from_db()
        assert record.attempts == attempt and "injected failure" in record.last_error
        backoff = cleanup.BACKOFF_BASE * 2 ** (attempt - 1)
        assert backoff <= (record.due_at - before).total_seconds() < backoff + 1
        if attempt == 1:  # a wait in between spends nothing
            JobHistory.objects.filter(job=job).update(summary=None)
            assert cleanup.execute(make_due(job).id).startswith("waiting")
            assert JobCleanupRecord.objects.get(id=record.id).attempts == 1
            JobHistory.objects.filter(job=job).update(summary=summary)
    assert record.state == "FAILED"
    assert running_state(job)["taskGroups"] == 3  # nothing removed
    assert cleanup.execute(record.id) == "failed already"
    assert cleanup.retry_failed(record.id)
    failing_removal(job, on=False)
    assert cleanup.execute(make_due(job).id) == "done"


def cleanup_messages(queue: redis.Redis) -> int:
    """Cleanup tasks waiting on the control queue (Celery's Redis transport: a list of JSON)."""
    from engine.protocol import CONTROL_QUEUE, TASK_CLEANUP

    return sum(
        json.loads(m)["headers"]["task"] == TASK_CLEANUP for m in queue.lrange(CONTROL_QUEUE, 0, -1)
    )


def test_the_countdown_hint_is_sent_when_a_job_ends_unless_it_is_turned_off(engine, settings):
    """engine.job-state-cleanup.hint: on, the terminal transaction sends its record's countdown
    to the control queue; off, it sends nothing (the sweep alone delivers records)."""
    from engine.protocol import CONTROL_QUEUE

    queue = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=5)
    queue.delete(CONTROL_QUEUE)
    ended_job(engine)
    assert cleanup_messages(queue) == 1
    settings.ENGINE = {**settings.ENGINE, "job-state-cleanup.hint": False}
    ended_job(engine)
    assert cleanup_messages(queue) == 1
    queue.delete(CONTROL_QUEUE)


def test_the_admin_console_lists_filters_and_runs_a_record_now(engine, client, admin_client):
    job = ended_job(engine)
    record = JobCleanupRecord.objects.get(job_id=job.id)
    page = admin_client.get("/admin/engine/jobcleanuprecord/?state__exact=PENDING")
    assert page.status_code == 200 and f">{job.id}<".encode() in page.content
    assert b"data-overdue" in page.content
    assert admin_client.get(f"/admin/engine/jobcleanuprecord/?q={job.id}").status_code == 200
    response = admin_client.post(
        "/admin/engine/jobcleanuprecord/",
        {"action": "run_now", "_selected_action": [record.id]},
    )
    assert response.status_code == 302
    record.refresh_from_db()
    assert record.due_at <= timezone.now() and record.enqueued_at is None
    from django.contrib.admin.models import LogEntry

    assert LogEntry.objects.filter(object_id=str(record.id)).exists()
    assert (
        admin_client.get(f"/admin/engine/jobcleanuprecord/{record.id}/change/").status_code == 200
    )
    assert admin_client.get("/admin/engine/jobcleanuprecord/add/").status_code == 403

    get_user_model().objects.create_user("plain", password="x-Very-long-pass-8")
    client.post("/accounts/login/", {"username": "plain", "password": "x-Very-long-pass-8"})
    assert client.get("/admin/engine/jobcleanuprecord/").status_code == 302  # to the login


def test_the_dashboard_shows_finished_jobs_and_cleanup_records_with_the_api_filters(engine, client):
    from tests.conftest import role_user

    job = ended_job(engine)
    cleanup.execute(make_due(job).id)
    client.force_login(role_user("watcher", "viewer"))
    page = client.get("/history/?jobStatus=CANCELED").content.decode()
    assert f'data-job-id="{job.id}"' in page
    assert (
        f'data-job-id="{job.id}"' not in client.get("/history/?jobStatus=FAILED").content.decode()
    )
    page = client.get(f"/cleanup/?state=DONE&jobId={job.id}").content.decode()
    assert page.count("data-record-id") == 1 and "JOB_STATE" in page
    assert "admin console" not in page  # viewers read; staff act in the admin
    assert "data-record-id" not in client.get("/cleanup/?state=FAILED").content.decode()
    detail = client.get(f"/jobs/{job.id}/").content.decode()  # read from its history now
    assert "CANCELED" in detail and "reader 1" in detail


def test_history_retention_removes_the_job_through_its_own_record(engine, api, settings):
    settings.ENGINE = {**settings.ENGINE, "history.retention": 0.0}
    job = ended_job(engine)
    cleanup.execute(make_due(job).id)
    history = JobCleanupRecord.objects.get(job_id=job.id, kind="HISTORY")
    assert cleanup.execute(history.id) == "done"
    assert not Job.objects.filter(id=job.id).exists()
    assert not JobHistory.objects.filter(job_id=job.id).exists()
    assert api.get(f"/api/v1/jobs/{job.id}").status_code == 404
    # The records stay (the audit of what was removed) until the retention of ended rows.
    assert set(JobCleanupRecord.objects.filter(job_id=job.id).values_list("kind", "state")) == {
        ("JOB_STATE", "DONE"),
        ("HISTORY", "DONE"),
    }


def test_sweepers_racing_claim_each_due_record_once(engine):
    jobs = [ended_job(engine) for _ in range(3)]
    for job in jobs:
        make_due(job)
    barrier = threading.Barrier(4)
    claimed: list[list[int]] = []

    def sweep():
        barrier.wait()
        try:
            with transaction.atomic():
                claimed.append(cleanup.claim_due())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    every = [record_id for ids in claimed for record_id in ids]
    assert sorted(every) == sorted(
        JobCleanupRecord.objects.filter(kind="JOB_STATE").values_list("id", flat=True)
    )
    with transaction.atomic():
        assert cleanup.claim_due() == []  # enqueued just now: not again before REENQUEUE_AFTER
