"""Back-pressure of a reader task group: the wall-clock seconds its data plane spends blocked in
its sinks' writes (``Chain.blocked_seconds``, timed per batch), reported with its progress and
as it ends, and shown per task group as ``metrics.blockedSeconds`` and
``metrics.backPressureRatio`` (blocked over busy, 0 to 1)."""

from __future__ import annotations

import threading

import pytest
from rest_framework.test import APIClient

from engine.jobs import lifecycle, splits
from engine.jobs.planner import plan_job
from engine.jobs.summary import group_metrics
from engine.member.dataplane import Counters, instantiate, run_reader
from engine.models import TaskGroup
from engine.states import ExecutionStatus, JobMode
from tests.conftest import role_user
from tests.dirtykit import running_job

ROWS, DELAY_MS = 25, 50  # the Console sink sleeps DELAY_MS between two printed rows
SLOW = f"""env {{ job.mode = BATCH }}
source {{ FakeSource {{ plugin_output = fake, row.num = {ROWS}, split.num = 1 }} }}
sink {{ Console {{ plugin_input = fake, limit = {ROWS}, log.print.delay.ms = {DELAY_MS} }} }}"""
FAST = """env { job.mode = BATCH }
source { FakeSource { plugin_output = fake, row.num = 100000, split.num = 4 } }
sink { Blackhole { plugin_input = fake } }"""


def run(config: str) -> tuple[Counters, list[tuple[float, float]]]:
    """The job's one pipeline read by one reader in this process: its counters, and the
    (busy, blocked) seconds of each progress report it made."""
    data = plan_job(config, None, {}).pipelines[0].to_json()
    source_splits = instantiate(data["source"]).create_splits(JobMode.BATCH)
    reports: list[tuple[float, float]] = []
    counted = run_reader(
        data,
        [{"splitId": s["splitId"], "split": s, "offset": 0} for s in source_splits],
        JobMode.BATCH,
        {"jobId": 1, "pipelineId": 1, "readerIndex": 0, "attempt": 1},
        threading.Event(),
        on_progress=lambda c, current: reports.append((c.busy_seconds, c.blocked_seconds)),
        on_split_done=lambda split_id, offset: None,
    )
    return counted, reports


def ratio(counted: Counters) -> float:
    return group_metrics(
        TaskGroup(busy_seconds=counted.busy_seconds, blocked_seconds=counted.blocked_seconds)
    )["backPressureRatio"]


def test_a_slow_sink_blocks_its_reader_for_the_time_it_sleeps_in_its_writes():
    counted, reports = run(SLOW)
    slept = (ROWS - 1) * DELAY_MS / 1000
    assert counted.written == ROWS
    assert slept <= counted.blocked_seconds < slept + 0.5
    assert counted.blocked_seconds <= counted.busy_seconds
    assert ratio(counted) >= 0.8
    # It ran past one metrics interval: its progress carried the times so far, blocked first.
    assert reports and all(0 < blocked <= busy for busy, blocked in reports)
    assert reports[-1][1] >= slept


def test_a_fast_sink_barely_blocks_its_reader():
    counted, _ = run(FAST)
    assert counted.written == 100_000
    assert 0 < counted.blocked_seconds < counted.busy_seconds
    assert ratio(counted) < 0.2


def test_the_ratio_is_zero_before_a_task_group_has_run_and_never_above_one():
    assert group_metrics(TaskGroup())["backPressureRatio"] == 0.0
    metrics = group_metrics(TaskGroup(busy_seconds=2.0, blocked_seconds=2.0004))
    assert metrics["backPressureRatio"] == 1.0 and metrics["blockedSeconds"] == 2.0


def reader_groups(api: APIClient, job_id: int) -> dict[int, dict]:
    detail = api.get(f"/api/v1/jobs/{job_id}")
    assert detail.status_code == 200, detail.content
    return {
        g["taskGroupId"]: g["metrics"]
        for p in detail.json()["pipelines"]
        for g in p["taskGroups"]
        if g["kind"] == "READER"
    }


@pytest.mark.django_db(transaction=True)
def test_the_job_api_shows_each_task_groups_back_pressure_while_it_runs_and_as_it_ends(engine):
    job, _ = running_job(engine, members=2)
    first, second = TaskGroup.objects.filter(job=job, kind="READER").order_by("id")
    api = APIClient()
    api.force_authenticate(role_user("pressure-viewer", "viewer"))

    # Lane B's progress statement and Lane A's metrics report both carry the times so far.
    reader = splits.Reader(first.id, first.attempt, first.member_id)
    assert splits.record_progress(
        reader, first.pipeline_id, 10, 10, 5.0, {}, busy_seconds=8.0, blocked_seconds=2.0
    )
    assert lifecycle.report_metrics(
        second.id,
        second.attempt,
        second.member_id,
        10,
        10,
        5.0,
        busy_seconds=3.0,
        blocked_seconds=2.9999,
    )
    shown = reader_groups(api, job.id)
    assert (shown[first.id]["blockedSeconds"], shown[first.id]["backPressureRatio"]) == (2.0, 0.25)
    assert (shown[second.id]["blockedSeconds"], shown[second.id]["backPressureRatio"]) == (
        3.0,
        1.0,
    )

    # As it ends, the metrics it reports last hold the blocked seconds after the bytes.
    assert lifecycle.finish_task_group(
        first.id,
        first.attempt,
        first.member_id,
        ExecutionStatus.FINISHED,
        metrics=(10, 10, 5.0, 4.0, 1.0, 100, 100, 1.5),
    )
    first.refresh_from_db()
    assert (first.busy_seconds, first.blocked_seconds) == (4.0, 1.5)
    assert reader_groups(api, job.id)[first.id]["backPressureRatio"] == 0.375
