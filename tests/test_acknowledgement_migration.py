"""Migration 0019 on real PostgreSQL: what the earlier acknowledgement made CLEAN reads UNKNOWN
again, acknowledged (a finished record rewritten, a running job given back a permanent gap)."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.db.models import Count

from engine.dirty.reading import job_summary
from engine.jobs.submission import submit_job
from engine.models import DirtyJobState, DirtyTrackingGap, Job
from history.models import JobHistory

pytestmark = pytest.mark.django_db(transaction=True)

migration = importlib.import_module("engine.migrations.0019_acknowledged_stay_unknown")
TRACKED = (
    "env { job.mode = STREAMING, job.dirty-task.threshold = 2 }\n"
    "source { FakeSource { } }\nsink { Blackhole { } }"
)
OLD_ACKNOWLEDGED = {
    "evaluationStatus": "CLEAN",
    "trackingComplete": True,
    "incompleteReason": None,
    "dirty": False,
    "generationCount": 1,
    "acknowledged": {"by": "ops", "at": "2026-11-30T10:00:00+00:00", "reason": "checked"},
}


def test_old_acknowledgements_read_unknown_and_acknowledged():
    finished, running, gapped, untouched = (submit_job(TRACKED) for _ in range(4))
    Job.objects.filter(id=finished.id).update(status="FINISHED")
    JobHistory.objects.create(job_id=finished.id, status="FINISHED", dirty_task=OLD_ACKNOWLEDGED)
    DirtyJobState.objects.filter(job_id__in=[running.id, gapped.id]).update(
        acknowledged_by="ops", acknowledged_at="2026-11-30T10:00:00Z", acknowledged_reason="ok"
    )
    DirtyTrackingGap.objects.create(job_id=gapped.id, reason="a gap kept by the new code")
    assert job_summary(Job.objects.get(id=running.id))["evaluationStatus"] == "CLEAN"

    migration.rewrite(apps, None)

    record = JobHistory.objects.get(job_id=finished.id).dirty_task
    assert "acknowledged" not in record
    assert (record["evaluationStatus"], record["trackingComplete"]) == ("UNKNOWN", False)
    assert record["incompleteReason"] == migration.REASON
    assert (record["acknowledgedBy"], record["acknowledgedReason"]) == ("ops", "checked")
    assert record["generationCount"] == 1
    assert job_summary(Job.objects.get(id=finished.id))["evaluationStatus"] == "UNKNOWN"
    gaps = dict(DirtyTrackingGap.objects.values_list("job_id").annotate(n=Count("id")))
    assert gaps == {running.id: 1, gapped.id: 1}  # no second gap; the unacknowledged job none
    summary = job_summary(Job.objects.get(id=running.id))
    assert (summary["evaluationStatus"], summary["trackingComplete"]) == ("UNKNOWN", False)
    assert job_summary(Job.objects.get(id=untouched.id))["evaluationStatus"] == "CLEAN"

    migration.rewrite(apps, None)  # a second run changes nothing
    assert DirtyTrackingGap.objects.count() == 2
    assert JobHistory.objects.get(job_id=finished.id).dirty_task == record
