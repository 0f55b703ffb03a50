"""A member's tags (``manage.py worker --tag key=value``), matched by a job's ``tag_filter``;
existing rows and rows written without naming the column get ``{}``."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("engine", "0025_lighter_event_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="member",
            name="tags",
            field=models.JSONField(
                db_default=models.Value({}, output_field=models.JSONField()), default=dict
            ),
        ),
    ]
