"""The Jdbc source and sink with SeaTunnel's options, on a real PostgreSQL database of the
test's own: a source query with partition bounds, table_path, where_condition; a sink with a
schema-qualified table, database, field_ide, enable_upsert and a custom query."""

from __future__ import annotations

import psycopg
import pytest

from engine.connectors.batches import from_rows
from engine.connectors.jdbc_writers import ExactlyOnceJdbcWriter
from engine.connectors.schema import Schema
from engine.jobconfig import ConfigError
from tests.localrun import run_batch
from tests.test_jobs_cluster import data_db

__all__ = ["data_db"]


@pytest.fixture
def db(data_db):
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE src (id bigint PRIMARY KEY, name text, grp int)")
        conn.execute(
            "INSERT INTO src SELECT g, 'name-' || g, g % 7 FROM generate_series(1, 1000) g"
        )
        conn.execute("CREATE SCHEMA other")
        conn.execute("CREATE TABLE other.sink (id bigint PRIMARY KEY, name text, grp int)")
        conn.execute('CREATE TABLE "UPPER" ("ID" bigint, "NAME" text)')
        conn.execute("CREATE TABLE log (id bigint, note text)")
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    database = data_db.rsplit("/", 1)[1]
    return url, database, data_db


def conn_options(url: str) -> str:
    return f'url = "{url}", user = root, password = t, driver = "org.postgresql.Driver"'


def count(dsn: str, sql: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchone()[0]


def test_a_query_split_by_partition_bounds_reads_every_row_once(db):
    url, database, dsn = db
    result = run_batch(
        f"""env {{ job.mode = BATCH, parallelism = 3 }}
        source {{ Jdbc {{ {conn_options(url)},
          query = "select id, name, grp from src where name like 'name-%'",
          partition_column = id, partition_num = 5,
          partition_lower_bound = 100, partition_upper_bound = 800, fetch_size = 50 }} }}
        sink {{ jdbc {{ {conn_options(url)}, database = {database},
          generate_sink_sql = true, table = "other.sink", primary_keys = [id],
          support_upsert_by_query_primary_key_exist = true, batch_size = 100,
          max_retries = 3 }} }}"""
    )
    assert result["received"] == 1000
    assert count(dsn, "SELECT count(DISTINCT id) FROM other.sink") == 1000
    warned = {w["path"].rsplit(".", 1)[1] for w in result["warnings"]}
    assert warned == {
        "support_upsert_by_query_primary_key_exist",
        "batch_size",
        "max_retries",
        "fetch_size",  # a COPY per split, in the data plane's batches
    }


def test_table_path_where_condition_and_field_ide(db):
    url, database, dsn = db
    run_batch(
        f"""env {{ job.mode = BATCH }}
        source {{ Jdbc {{ {conn_options(url)}, table_path = "{database}.public.src",
          where_condition = "grp = 3" }} }}
        transform {{ Filter {{ include_fields = [id, name] }} }}
        sink {{ Jdbc {{ {conn_options(url)}, table = UPPER, field_ide = UPPERCASE }} }}"""
    )
    assert count(dsn, 'SELECT count(*) FROM "UPPER"') == count(
        dsn, "SELECT count(*) FROM src WHERE grp = 3"
    )


def test_a_custom_sink_query_runs_for_every_row(db):
    url, _, dsn = db
    run_batch(
        f"""env {{ job.mode = BATCH }}
        source {{ Jdbc {{ {conn_options(url)},
          query = "select id, name from src where id <= 10" }} }}
        sink {{ Jdbc {{ {conn_options(url)},
          query = "insert into log (id, note) values (?, 'row ' || ?)" }} }}"""
    )
    with psycopg.connect(dsn) as conn:
        notes = conn.execute("SELECT note FROM log ORDER BY id").fetchall()
    assert [n for (n,) in notes] == [f"row name-{i}" for i in range(1, 11)]


@pytest.mark.parametrize(
    "source,path,message",
    [
        ('query = "delete from src"', "query", "must be one SELECT (or WITH ... SELECT) statement"),
        (
            'query = "select 1 as id) as x; commit; delete from src; select (1"',
            "query",
            "multiple commands",
        ),
        (
            'table = src, where_condition = "true) as x; commit; delete from src; select (1"',
            "where_condition",
            "multiple commands",
        ),
        (
            'query = "with d as (delete from src returning *) select * from d"',
            "query",
            "data-modifying statement",
        ),
        ('query = "select * from nope"', "query", 'relation "nope" does not exist'),
        ("table_list = [{ table_path = src }], table = src", "table_list", "not both"),
        ('table_path = "elsewhere.public.src"', "database", "is not the url's database"),
        ("table = src, partition_column = nope", "partition_column", "not a column of the rows"),
    ],
)
def test_bad_source_options_are_400s_that_name_them(db, source, path, message):
    url, _, _ = db
    with pytest.raises(ConfigError) as caught:
        run_batch(
            f"source {{ Jdbc {{ {conn_options(url)}, {source} }} }}\nsink {{ Blackhole {{}} }}"
        )
    errors = caught.value.errors
    assert any(e["path"].endswith(path) and message in e["message"] for e in errors), errors
    assert count(db[2], "SELECT count(*) FROM src") == 1000  # nothing was written


def test_a_custom_query_s_placeholders_must_match_the_fields(db):
    url, _, _ = db
    with pytest.raises(ConfigError) as caught:
        run_batch(
            f"""source {{ Jdbc {{ {conn_options(url)}, table = src }} }}
            sink {{ Jdbc {{ {conn_options(url)}, query = "insert into log values (?, ?)" }} }}"""
        )
    assert "has 2 ? for 3 incoming fields" in str(caught.value)


def test_a_custom_query_is_exactly_once_through_checkpoints(db):
    """Checkpointed, the rows wait in a stage of the query's own and run through the query
    when their checkpoint completes; committing twice runs nothing twice."""
    url, _, dsn = db
    config = {
        "url": url,
        "user": "root",
        "password": "t",
        "query": "insert into log (id, note) values (?, ?)",
    }
    schema = Schema((("id", "bigint"), ("note", "string")))
    writer = ExactlyOnceJdbcWriter(config, schema, {"jobId": 9, "pipelineId": 1, "attempt": 1})
    writer.write(from_rows([(1, "a"), (2, "b")], schema))
    writer.prepare_commit(1)
    writer.write(from_rows([(3, "c")], schema))
    writer.prepare_commit(2)
    assert count(dsn, "SELECT count(*) FROM log") == 0
    writer.commit({"checkpoint": 1})
    writer.commit({"checkpoint": 1})
    assert count(dsn, "SELECT count(*) FROM log") == 2
    writer.close()
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, note FROM log ORDER BY id").fetchall()
    assert rows == [(1, "a"), (2, "b"), (3, "c")]
