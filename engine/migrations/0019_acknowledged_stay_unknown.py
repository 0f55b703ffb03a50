"""What the earlier acknowledgement made CLEAN reads UNKNOWN again, acknowledged.

That code dropped an acknowledged job's gaps and froze a finished one's summary as CLEAN with an
``acknowledged`` object. A finished record gets the flat acknowledgement fields and reads UNKNOWN
(DIRTY if it was); a job acknowledged while it ran gets a permanent gap, so it reads UNKNOWN until
its record is written (engine.dirty.acknowledge, docs/decisions/0022).
"""

from django.db import migrations

REASON = "acknowledged before an acknowledgement kept the job UNKNOWN; its gap was not kept"


def rewrite(apps, schema_editor):
    JobHistory = apps.get_model("history", "JobHistory")
    DirtyJobState = apps.get_model("engine", "DirtyJobState")
    DirtyTrackingGap = apps.get_model("engine", "DirtyTrackingGap")
    for record in JobHistory.objects.filter(dirty_task__has_key="acknowledged").iterator():
        summary = dict(record.dirty_task)
        ack = summary.pop("acknowledged") or {}
        summary.update(
            evaluationStatus="DIRTY" if summary.get("dirty") else "UNKNOWN",
            trackingComplete=False,
            incompleteReason=summary.get("incompleteReason") or REASON,
            acknowledgedBy=ack.get("by"),
            acknowledgedAt=ack.get("at"),
            acknowledgedReason=ack.get("reason"),
        )
        JobHistory.objects.filter(pk=record.pk).update(dirty_task=summary)
    gapped = DirtyTrackingGap.objects.values("job_id")
    acknowledged = DirtyJobState.objects.filter(acknowledged_at__isnull=False).exclude(
        job_id__in=gapped
    )
    DirtyTrackingGap.objects.bulk_create(
        DirtyTrackingGap(job_id=job_id, repairable=False, reason=REASON)
        for job_id in acknowledged.values_list("job_id", flat=True)
    )


class Migration(migrations.Migration):
    dependencies = [
        ("engine", "0018_slot_ownership"),
        ("history", "0002_cleanup_records"),
    ]

    operations = [migrations.RunPython(rewrite, migrations.RunPython.noop)]
