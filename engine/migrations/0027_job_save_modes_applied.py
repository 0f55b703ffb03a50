"""Job.save_modes_applied_at: when the job's sinks applied their save modes (once per job, before
its first split is assigned); null until then, and for jobs whose sinks have none to apply."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("engine", "0026_member_tags")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="save_modes_applied_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
