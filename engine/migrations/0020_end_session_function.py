"""``keel_end_session(pid)``: end one session and say why not, in the statement that finds them.

The active master ends every session of a removed member. Ending them one statement each (and
each in a savepoint, so a refused one spares none of the others) cost two round trips a session
on the removal path; the function catches the refusal itself, so one statement finds and ends
them all and returns, for each, NULL or the reason it could not.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION keel_end_session(target integer) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_terminate_backend(target);
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLERRM;
END
$$
"""

DROP = "DROP FUNCTION IF EXISTS keel_end_session(integer)"


class Migration(migrations.Migration):
    dependencies = [("engine", "0019_acknowledged_stay_unknown")]

    operations = [migrations.RunSQL(CREATE, DROP)]
