"""Retention sweeps (the active master's, under its epoch): old events by age and by count,
REMOVED/LEFT members with their slots, DONE control steps and the split assignments of jobs
ended long ago; everything younger, or still live, stays."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from engine import retention
from engine.fencing import StaleEpoch
from engine.jobs import splits
from engine.jobs.submission import submit_job
from engine.models import ControlStep, EngineEvent, Job, Member, Pipeline, Slot, SplitAssignment

pytestmark = pytest.mark.django_db(transaction=True)
JOB = "env { job.mode = BATCH }\nsource { FakeSource { } }\nsink { Blackhole { } }"
LONG_AGO = timezone.now() - timedelta(days=2)


def ended_job(finished_at) -> Job:
    job = submit_job(JOB)
    Job.objects.filter(id=job.id).update(status="FINISHED", finished_at=finished_at)
    pipeline = Pipeline.objects.get(job=job)
    splits.assign(pipeline.id, [{"splitId": "a"}], readers=1, owned=lambda: True)
    return job


def test_sweeps_what_is_old_and_keeps_the_rest(engine, monkeypatch):
    monkeypatch.setitem(settings.ENGINE, "retention.events-count", 1_000_000)
    old_job, young_job = ended_job(LONG_AGO), ended_job(timezone.now())
    gone, here = engine.add_member(slots=2), engine.add_member(slots=2)
    engine.lose(gone)
    Member.objects.filter(id=gone.id).update(ended_at=LONG_AGO)
    left = engine.add_member(slots=2)
    engine.leave(left)  # ended just now: kept for a day
    old_step = ControlStep.objects.create(
        key="old", kind="RESTORE_PIPELINE", job=old_job, payload={}, state="DONE"
    )
    ControlStep.objects.filter(id=old_step.id).update(done_at=LONG_AGO)
    ControlStep.objects.create(
        key="young",
        kind="RESTORE_PIPELINE",
        job=young_job,
        payload={},
        state="DONE",
        done_at=timezone.now(),
    )
    EngineEvent.objects.filter(seq__lte=EngineEvent.objects.order_by("seq")[1].seq).update(
        at=LONG_AGO - timedelta(days=7)
    )
    events = EngineEvent.objects.count()

    while retention.sweep(engine.epoch):
        pass

    assert EngineEvent.objects.count() == events - 2
    assert set(Member.objects.values_list("id", flat=True)) == {here.id, left.id}
    assert not Slot.objects.filter(member_id=gone.id).exists()
    assert list(ControlStep.objects.values_list("key", flat=True)) == ["young"]
    assert list(SplitAssignment.objects.values_list("pipeline__job_id", flat=True)) == [
        young_job.id
    ]
    assert Job.objects.count() == 2  # the jobs themselves (their history) stay


def test_events_beyond_the_newest_count_go_and_a_stale_epoch_deletes_nothing(engine, monkeypatch):
    for _ in range(3):
        submit_job(JOB)
    newest = EngineEvent.objects.order_by("-seq").first().seq
    monkeypatch.setitem(settings.ENGINE, "retention.events-count", 2)
    with pytest.raises(StaleEpoch):
        retention.sweep(engine.epoch - 1)
    retention.sweep(engine.epoch)
    assert list(EngineEvent.objects.values_list("seq", flat=True)) == [newest - 1, newest]
