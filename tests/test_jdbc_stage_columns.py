"""A checkpointed Jdbc sink's staging table outlives its job: when the target is recreated
with other columns (RECREATE_SCHEMA), the next job's writer adds what the stage lacks, and its
rows land whole."""

from __future__ import annotations

import psycopg

from tests.test_jdbc_nested_sink import generated, write_checkpointed
from tests.test_jobs_cluster import data_db

__all__ = ["data_db"]


def config(url: str, fields: str, sink: str) -> str:
    return f"""env {{ job.mode = BATCH }}
    source {{ FakeSource {{ row.num = 6, schema {{ fields {{ {fields} }} }} }} }}
    sink {{ Jdbc {{ url = "{url}", user = root, password = t, table = staged, {sink} }} }}"""


def test_a_recreated_table_with_a_new_column_is_written_through_the_old_stage(data_db):
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    first = config(url, "id = bigint", "is_exactly_once = false")
    write_checkpointed(first, *generated(first))
    second = config(
        url,
        "id = bigint, name = string",
        "schema_save_mode = RECREATE_SCHEMA, data_save_mode = DROP_DATA",
    )
    schema, rows = generated(second)
    write_checkpointed(second, schema, rows)
    with psycopg.connect(data_db) as conn:
        written = conn.execute("SELECT id, name FROM staged ORDER BY id").fetchall()
    assert written == sorted((r[0], r[1]) for r in rows)
