"""Room on every page of the tracker's state rows for their next version.

A member loss updates the state row and the active episode of every job it affects, in one
statement. Packed pages leave no room for the new versions, so each update wrote a new tuple on
another page and an entry in every index; with half of each page free the updates are heap-only
(HOT), which halved the statement's time under 1,000 affected jobs (bench/member_loss). Both
tables hold one row per job (or per episode), so the space is small.
"""

from django.db import migrations

TABLES = ("engine_dirtyjobstate", "engine_recoveryepisode")


class Migration(migrations.Migration):
    dependencies = [("engine", "0020_end_session_function")]

    operations = [
        migrations.RunSQL(
            [f"ALTER TABLE {table} SET (fillfactor = 50)" for table in TABLES],
            [f"ALTER TABLE {table} RESET (fillfactor)" for table in TABLES],
        )
    ]
