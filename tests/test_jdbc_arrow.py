"""The Jdbc source and sink move Arrow batches with ADBC (binary COPY): every PostgreSQL type
the source reads arrives in a target of the same shape as it was, through each sink path (a
straight insert, a stage with an upsert, the exactly-once stage), and a column binary COPY
cannot write is staged as text and cast back by PostgreSQL."""

from __future__ import annotations

from decimal import Decimal

import psycopg
import pytest

from engine.connectors.batches import from_rows
from engine.connectors.jdbc_writers import ExactlyOnceJdbcWriter
from engine.connectors.schema import Schema
from tests.localrun import run_batch
from tests.test_jobs_cluster import data_db

__all__ = ["data_db"]

SHAPE = """(id bigint PRIMARY KEY, s smallint, i integer, f4 real, f8 double precision,
    n numeric(12, 3), nu numeric, big numeric(20, 2), t text, v varchar(10), c char(3),
    b boolean, d date, ts timestamp, tz timestamptz, u uuid, j jsonb, raw bytea)"""
ROWS = """
    (1, 1, 2, 1.5, 2.25, 1234.567, 12345.6789, 123456789012345678.91, 'naïve ☃', 'short',
     'ab', true, '2026-12-04',
     '2026-12-04 01:02:03.456789', '2026-12-04 01:02:03.456789+05:30',
     'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2]}', '\\x00ff'),
    (2, -32768, -2147483648, -0.5, 1e300, -0.001, 0.1, -0.01, '', '%_\\', 'xyz', false,
     '0001-01-01',
     '1970-01-01 00:00:00', '2038-01-19 03:14:08+00', '00000000-0000-0000-0000-000000000000',
     '[]', '\\x'),
    (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL)
"""


@pytest.fixture
def db(data_db):
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE typed {SHAPE}")
        conn.execute(f"INSERT INTO typed VALUES {ROWS}")
        for name in ("straight", "upserted", "staged"):
            conn.execute(f"CREATE TABLE {name} {SHAPE}")
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    return url, data_db


def connection(url: str) -> str:
    return f'url = "{url}", user = root, password = t'


def differences(dsn: str, table: str) -> list[tuple]:
    """Rows in one table and not in the other (both ways): none when they are equal."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            f"(SELECT * FROM typed EXCEPT SELECT * FROM {table})"
            f" UNION ALL (SELECT * FROM {table} EXCEPT SELECT * FROM typed)"
        ).fetchall()


def test_every_type_arrives_as_it_was_straight_and_through_an_upsert(db):
    url, dsn = db
    for table, extra in (("straight", ""), ("upserted", ", primary_keys = [id]")):
        for _ in range(2):  # an upsert replayed changes nothing
            if not extra:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f"TRUNCATE {table}")
            result = run_batch(
                f"""env {{ job.mode = BATCH, parallelism = 2 }}
                source {{ Jdbc {{ {connection(url)}, table = typed, split.num = 2 }} }}
                sink {{ Jdbc {{ {connection(url)}, table = {table}{extra} }} }}"""
            )
            assert result["received"] == result["written"] == 3
        assert differences(dsn, table) == [], table


def test_a_source_query_reads_into_arrow_with_its_own_percent_signs(db):
    url, dsn = db
    result = run_batch(
        f"""env {{ job.mode = BATCH }}
        source {{ Jdbc {{ {connection(url)},
          query = "select * from typed where v like '%\\\\_%' or t like 'na%'" }} }}
        sink {{ Jdbc {{ {connection(url)}, table = straight }} }}"""
    )
    assert result["written"] == 2
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT array_agg(id ORDER BY id) FROM straight").fetchone() == (
            [1, 2],
        )


def read_typed(dsn: str) -> tuple[Schema, list[tuple]]:
    """The typed table's rows, as the Jdbc source's schema types them."""
    from engine.connectors.jdbc import JdbcSource

    url = "jdbc:" + dsn.replace("postgres://", "postgresql://")
    config = {
        "url": url,
        "user": "root",
        "password": "t",
        "table": "typed",
        "query": "",
        "where_condition": "",
        "partition_column": "",
        "split.num": 1,
        "fetch_size": 1000,
    }
    source = JdbcSource(config, "source[0].Jdbc")
    schema = source.output_schema()
    [split] = source.create_splits("BATCH")
    from engine.connectors.batches import to_rows

    rows = [r for batch, _ in source.read(split, 0, "BATCH", 1000) for r in to_rows(batch)]
    return schema, sorted(rows, key=lambda r: r[0])


def writer_for(url: str, schema: Schema, attempt: int, restored: int | None = None):
    context = {"jobUuid": "arrow-test", "pipelineId": 1, "readerIndex": 0, "attempt": attempt}
    if restored is not None:
        context["restoredCheckpoint"] = restored
    config = {"url": url, "user": "root", "password": "t", "table": "staged", "query": ""}
    return ExactlyOnceJdbcWriter(config, schema, context)


def test_the_exactly_once_stage_commits_each_cut_once_and_a_restore_drops_the_rest(db):
    url, dsn = db
    schema, rows = read_typed(dsn)
    first = writer_for(url, schema, attempt=1)
    try:
        first.write(from_rows(rows[:2], schema))
        first.prepare_commit(1)
        first.write(from_rows(rows[2:], schema))  # after the cut: never checkpoint 1's
        first.prepare_commit(2)
        first.commit({"checkpoint": 1})
        first.commit({"checkpoint": 1})  # twice: nothing more
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM staged").fetchone() == (2,)
            # The stage holds the rows after cut 1 and cut 2's mark, nothing of cut 1.
            assert conn.execute(
                "SELECT count(*) FILTER (WHERE keel_mark), count(*) FILTER (WHERE NOT keel_mark)"
                " FROM staged__keel_stage"
            ).fetchone() == (1, 1)
    finally:
        first.abort()
    # Checkpoint 2 never completed: the next attempt restores from 1 and drops the rest.
    second = writer_for(url, schema, attempt=2, restored=1)
    second.abort()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM staged__keel_stage").fetchone() == (0,)
        assert conn.execute("SELECT array_agg(id ORDER BY id) FROM staged").fetchone() == ([1, 2],)
    # Written again and committed by its close (a batch job's end): every type as it was.
    third = writer_for(url, schema, attempt=3, restored=1)
    third.write(from_rows(rows[2:], schema))
    third.close()
    assert differences(dsn, "staged") == []


def test_a_stage_column_binary_copy_cannot_write_becomes_text(db):
    """A stage made before (of the target's types) is turned to text where Arrow has no
    binary form of the type; the commit casts it back."""
    url, dsn = db
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE staged__keel_stage AS SELECT * FROM staged WITH NO DATA")
        for ddl in (
            "keel_writer text",
            "keel_checkpoint bigint",
            "keel_seq bigserial",
            "keel_mark boolean NOT NULL DEFAULT false",
        ):
            conn.execute(f"ALTER TABLE staged__keel_stage ADD COLUMN {ddl}")
    schema, rows = read_typed(dsn)
    writer = writer_for(url, schema, attempt=1)
    writer.write(from_rows(rows, schema))
    writer.close()
    with psycopg.connect(dsn) as conn:
        types = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_name = 'staged__keel_stage'"
            ).fetchall()
        )
    assert {c: types[c] for c in ("n", "nu", "big", "u", "j", "c", "i", "tz")} == {
        "n": "text",
        "nu": "text",
        "big": "text",
        "u": "text",
        "j": "text",
        "c": "text",
        "i": "integer",
        "tz": "timestamp with time zone",
    }
    assert differences(dsn, "staged") == []


def test_a_value_the_target_cannot_take_fails_its_batch_not_a_later_commit(db):
    """Text-staged columns are parsed as their batch is staged: a bad value fails the write,
    before any barrier could take it into a checkpoint whose commit would then fail forever."""
    url, _ = db
    schema = Schema((("id", "bigint"), ("u", "string")))
    writer = writer_for(url, schema, attempt=1)
    try:
        writer.write(from_rows([(1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")], schema))
        with pytest.raises(Exception, match="uuid"):
            writer.write(from_rows([(2, "not a uuid")], schema))
    finally:
        writer.abort()


def test_a_number_over_its_columns_precision_fails_its_batch_not_a_later_commit(db):
    url, dsn = db
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE staged ALTER COLUMN n TYPE numeric(5, 2)")
    schema = Schema((("id", "bigint"), ("n", "decimal(38, 18)")))
    writer = writer_for(url, schema, attempt=1)
    try:
        writer.write(from_rows([(1, Decimal("123.45"))], schema))
        with pytest.raises(Exception, match="overflow"):
            writer.write(from_rows([(2, Decimal("12345.6"))], schema))
        writer.prepare_commit(1)
        writer.commit({"checkpoint": 1})  # what was written commits
    finally:
        writer.abort()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT id, n FROM staged").fetchall() == [(1, Decimal("123.45"))]


def test_a_view_and_a_too_long_value_take_the_insert_path(db):
    """COPY cannot write a view (nor a table with rules or row security): the stage's INSERT
    does. A value longer than its column fails the job, never truncated."""
    url, dsn = db
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE VIEW through AS SELECT * FROM straight")
        conn.execute("CREATE TABLE narrow (id bigint, t varchar(3))")
    run_batch(
        f"""env {{ job.mode = BATCH }}
        source {{ Jdbc {{ {connection(url)}, table = typed }} }}
        sink {{ Jdbc {{ {connection(url)}, table = through }} }}"""
    )
    assert differences(dsn, "straight") == []
    with pytest.raises(Exception, match="too long"):
        run_batch(
            f"""env {{ job.mode = BATCH }}
            source {{ Jdbc {{ {connection(url)}, query = "select id, t from typed" }} }}
            sink {{ Jdbc {{ {connection(url)}, table = narrow }} }}"""
        )
