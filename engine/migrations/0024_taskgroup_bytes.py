"""TaskGroup bytes read and written beside its rows (the Arrow size of its batches); a database
default of 0, so a process from before that inserts a task group leaves them at zero."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("engine", "0023_slot_states_follow_task_groups"),
    ]

    operations = [
        migrations.AddField(
            model_name="taskgroup",
            name="sink_written_bytes",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="taskgroup",
            name="source_received_bytes",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
    ]
