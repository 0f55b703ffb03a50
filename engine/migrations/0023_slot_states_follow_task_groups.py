"""A slot is ASSIGNED exactly when a live task group names it. The cleanup that migration 0018
followed could free a slot under a live task group (the scheduler would then give it to a
second one) or leave one ASSIGNED with nobody on it; a database that ran it is mended here."""

from django.db import migrations


def mend(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute(
            "UPDATE engine_slot SET state = 'ASSIGNED' WHERE state <> 'ASSIGNED' AND id IN"
            " (SELECT slot_id FROM engine_taskgroup WHERE slot_id IS NOT NULL)"
        )
        cur.execute(
            "UPDATE engine_slot s SET state = 'FREE' WHERE s.state = 'ASSIGNED' AND NOT EXISTS"
            " (SELECT 1 FROM engine_taskgroup t WHERE t.slot_id = s.id)"
        )


class Migration(migrations.Migration):
    dependencies = [("engine", "0022_job_uuid")]
    operations = [migrations.RunPython(mend, migrations.RunPython.noop)]
