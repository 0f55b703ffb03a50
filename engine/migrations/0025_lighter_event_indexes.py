"""Two indexes fewer to write on the hot paths: an event's kind keeps its btree and loses the
LIKE index Django adds to an indexed text field (no query uses it), and a member-loss
incident's job is served by its unique (job, lost member) constraint."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("engine", "0024_taskgroup_bytes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="engineevent",
            name="kind",
            field=models.CharField(max_length=64),
        ),
        migrations.AlterField(
            model_name="memberlossincident",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="member_loss_incidents",
                to="engine.job",
            ),
        ),
        migrations.AddIndex(
            model_name="engineevent",
            index=models.Index(fields=["kind"], name="engine_event_kind"),
        ),
    ]
