"""Arrays, maps and nested rows into a table the Jdbc sink creates (schema_save_mode's default,
CREATE_SCHEMA_WHEN_NOT_EXIST), on PostgreSQL (arrays of scalars as arrays of their type, maps
and rows as jsonb) and on MySQL (JSON columns): what FakeSource generated reads back equal,
written at least once and through the checkpointed (exactly-once) writer."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from engine.connectors.batches import from_rows, to_rows
from engine.connectors.schema import Schema, jsonable
from engine.jobs.planner import plan_job
from engine.member.dataplane import instantiate
from tests.localrun import run_batch
from tests.mariadbkit import mariadb
from tests.test_jdbc_mysql import mysql_options
from tests.test_jobs_cluster import data_db

__all__ = ["data_db", "mariadb"]

FIELDS = """id = bigint, ints = "array<int>", floats = "array<float>", vec = float_vector,
  words = "array<string>", counts = "map<string, int>", nested { a = int, b = string }"""


def job(sink: str) -> str:
    return f"""env {{ job.mode = BATCH }}
    source {{ FakeSource {{ row.num = 6, split.num = 1, array.size = 3, map.size = 2,
      schema {{ fields {{ {FIELDS} }} }} }} }}
    sink {{ Jdbc {{ {sink} }} }}"""


def generated(config: str) -> tuple[Schema, list[tuple]]:
    """The source's schema and rows, as FakeSource generates them (from the row id)."""
    pipeline = plan_job(config).pipelines[0].to_json()
    source = instantiate(pipeline["source"])
    rows = [
        r
        for split in source.create_splits("BATCH")
        for batch, _ in source.read(split, 0, "BATCH", 100)
        for r in to_rows(batch)
    ]
    return source.output_schema(), rows


def write_checkpointed(config: str, schema: Schema, rows: list[tuple]) -> None:
    """The job's sink, its save modes applied, written by its checkpointed writer: a batch,
    a barrier, the checkpoint's commit, the end of the pipeline."""
    pipeline = plan_job(config).pipelines[0].to_json()
    sink = instantiate(pipeline["sinks"][0])
    sink.input_schema = schema
    sink.apply_save_modes()
    context = {
        "jobUuid": f"nested-{uuid.uuid4().hex[:6]}",
        "pipelineId": 1,
        "readerIndex": 0,
        "attempt": 1,
        "checkpointing": True,
        "label": "sink[0].Jdbc",
    }
    writer = sink.writer(schema, context)
    writer.write(from_rows(rows, schema))
    writer.commit(writer.prepare_commit(1))
    writer.close()


def expected(schema: Schema, rows: list[tuple], arrays_as_json: bool) -> list[tuple]:
    """Rows as read back: maps and rows as JSON objects; arrays as lists."""
    out = []
    for row in rows:
        values = []
        for kind, value in zip(schema.kinds, row, strict=True):
            nested = kind.startswith(("map", "row")) or (arrays_as_json and kind != "bigint")
            values.append(jsonable(kind, value) if nested else value)
        out.append(tuple(values))
    return sorted(out)


@pytest.mark.parametrize("checkpointed", [False, True])
def test_nested_values_into_a_created_postgresql_table(data_db, checkpointed):
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    table = f"nested_{uuid.uuid4().hex[:6]}"
    config = job(
        f'url = "{url}", user = root, password = t, table = {table}, is_exactly_once = true'
    )
    schema, rows = generated(config)
    assert len(rows) == 6 and schema.kinds[3] == "array<float>"  # a vector is an array
    if checkpointed:
        write_checkpointed(config, schema, rows)
    else:
        assert run_batch(config)["written"] == 6
    with psycopg.connect(data_db) as conn:
        types = conn.execute(
            "SELECT column_name, format_type(atttypid, atttypmod) FROM information_schema.columns"
            " JOIN pg_attribute ON attrelid = %s::regclass AND attname = column_name"
            " WHERE table_name = %s ORDER BY ordinal_position",
            (table, table),
        ).fetchall()
        back = sorted(conn.execute(f"SELECT * FROM {table}").fetchall())
    assert [t for _, t in types] == [
        "bigint",
        "integer[]",
        "real[]",
        "real[]",
        "text[]",
        "jsonb",
        "jsonb",
    ]
    assert back == expected(schema, rows, arrays_as_json=False)


@pytest.mark.parametrize("checkpointed", [False, True])
def test_nested_values_into_a_created_mysql_table(mariadb, checkpointed):
    table = f"nested_{uuid.uuid4().hex[:6]}"
    config = job(f"{mysql_options(mariadb)}, table = {table}")
    schema, rows = generated(config)
    if checkpointed:
        write_checkpointed(config, schema, rows)
    else:
        assert run_batch(config)["written"] == 6
    back = sorted(
        (row[0], *(json.loads(v) for v in row[1:]))
        for row in mariadb.execute(f"SELECT * FROM {table}")
    )
    assert back == expected(schema, rows, arrays_as_json=True)
