"""Jobs that exist before save modes: their sinks already wrote rows, so their save modes count
as applied (a restore of such a job must never drop what it wrote)."""

from django.db import migrations
from django.db.models.functions import Now


def mark_applied(apps, schema_editor):
    Job = apps.get_model("engine", "Job")
    Job.objects.filter(save_modes_applied_at__isnull=True).update(save_modes_applied_at=Now())


class Migration(migrations.Migration):
    dependencies = [("engine", "0027_job_save_modes_applied")]

    operations = [migrations.RunPython(mark_applied, migrations.RunPython.noop)]
