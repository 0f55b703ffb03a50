"""Jobs that started before save modes: their sinks may have written rows, so their save modes
count as applied (a restore must never drop what they wrote). A job not started yet starts as any
job does: planned before, its sinks have no save modes; planned since, they apply once."""

from django.db import migrations
from django.db.models.functions import Now


def mark_applied(apps, schema_editor):
    Job = apps.get_model("engine", "Job")
    Job.objects.filter(save_modes_applied_at__isnull=True).exclude(
        status__in=("CREATED", "PENDING")
    ).update(save_modes_applied_at=Now())


class Migration(migrations.Migration):
    dependencies = [("engine", "0027_job_save_modes_applied")]

    operations = [migrations.RunPython(mark_applied, migrations.RunPython.noop)]
