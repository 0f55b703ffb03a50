"""Job.uuid: jobs submitted from now on get one (a column default, so plain INSERTs too); jobs
submitted before keep none, so what they named in other systems keeps its name."""

from django.db import migrations, models

import engine.models.fields


class Migration(migrations.Migration):
    dependencies = [("engine", "0021_tracker_fillfactor")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="uuid",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="uuid",
            field=models.UUIDField(
                blank=True,
                db_default=engine.models.fields.RandomUUID(),
                editable=False,
                null=True,
            ),
        ),
    ]
