"""Job.uuid: what names a job's writers in other systems once every member can use it (jobs
from before have none and keep the names of their ids)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("engine", "0021_tracker_fillfactor")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="uuid",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
    ]
