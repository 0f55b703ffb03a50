"""The Jdbc source reads what SeaTunnel's e2e jobs read, on PostgreSQL and on MySQL (a private
MariaDB): a table without a primary key (one split, resumed exactly from any offset, duplicate
rows and rows a collation calls equal included), a partition column that is not an integer
(cut at its quantiles, NULLs their own split, each row read once), and every column of a type
without a Keel mapping as its text."""

from __future__ import annotations

import uuid
from collections import Counter

import psycopg
import pytest

from engine.connectors.batches import to_rows
from engine.jobconfig import ConfigError
from engine.jobs.planner import plan_job
from engine.member.dataplane import instantiate
from tests.mariadbkit import mariadb
from tests.test_jdbc_mysql import mysql_options
from tests.test_jobs_cluster import data_db

__all__ = ["data_db", "mariadb"]

#: Rows with duplicates, values only a byte order tells apart ('a', 'A', 'a '), and NULLs.
NAMES = ["b", "a", "A", "a ", "a", None, "b", "c", "a", None, "Z", "é", "e"]


@pytest.fixture
def pg(data_db):
    """(connection options, DSN) of a database of the test's own."""
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    return f'url = "{url}", user = root, password = t', data_db


def pg_execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def source_of(options: str, extra: str):
    """The configured Jdbc source of a planned job."""
    plan = plan_job(f"source {{ Jdbc {{ {options}, {extra} }} }}\nsink {{ Console {{ }} }}")
    return instantiate(plan.pipelines[0].to_json()["source"])


def rows_from(source, split: dict, offset: int = 0) -> list[tuple]:
    return [r for batch, _ in source.read(split, offset, "BATCH", 4) for r in to_rows(batch)]


def check_resumes(source, split: dict, every: int = 1) -> list[tuple]:
    """A split's rows, read whole and again from every ``every``-th offset (and the end):
    each resume reads exactly the rest."""
    whole = rows_from(source, split)
    for offset in [*range(0, len(whole), every), len(whole)]:
        assert rows_from(source, split, offset) == whole[offset:], (split, offset)
    return whole


def plan_error(options: str, extra: str) -> dict:
    with pytest.raises(ConfigError) as caught:
        source_of(options, extra)
    return caught.value.errors[0]


def keyless_tables(execute, table: str, text_type: str) -> None:
    execute(
        f"CREATE TABLE {table} (n int, name {text_type})",
        f"INSERT INTO {table} VALUES "
        + ", ".join(f"({i % 3}, {'NULL' if v is None else repr(v)})" for i, v in enumerate(NAMES)),
    )


@pytest.mark.parametrize("database", ["postgresql", "mysql"])
def test_a_table_without_a_key_is_one_split_resumed_exactly(database, request):
    table = f"t_{uuid.uuid4().hex[:8]}"
    if database == "postgresql":
        options, dsn = request.getfixturevalue("pg")
        keyless_tables(lambda *s: pg_execute(dsn, *s), table, "text")
    else:
        db = request.getfixturevalue("mariadb")
        options = mysql_options(db)
        keyless_tables(db.execute, table, "varchar(10)")  # a case-insensitive collation
    source = source_of(options, f"table = {table}")
    [split] = source.create_splits("BATCH")
    assert split["splitId"] == "all"
    rows = check_resumes(source, split)
    assert Counter(rows) == Counter((i % 3, v) for i, v in enumerate(NAMES))


@pytest.mark.parametrize("database", ["postgresql", "mysql"])
def test_a_text_partition_column_is_cut_at_its_quantiles(database, request):
    table = f"t_{uuid.uuid4().hex[:8]}"
    values = [(i, None if i % 10 == 0 else f"name-{i % 37:02d}", "{}") for i in range(1, 201)]
    inserts = f"INSERT INTO {table} VALUES " + ", ".join(
        f"({i}, {'NULL' if v is None else repr(v)}, '{j}')" for i, v, j in values
    )
    if database == "postgresql":
        options, dsn = request.getfixturevalue("pg")
        pg_execute(dsn, f"CREATE TABLE {table} (id int, varchar_col varchar(20), j json)", inserts)
    else:
        db = request.getfixturevalue("mariadb")
        options = mysql_options(db)
        db.execute(
            f"CREATE TABLE {table} (id int PRIMARY KEY, varchar_col varchar(20), j text)", inserts
        )
    source = source_of(options, f"table = {table}, partition_column = varchar_col, split.num = 3")
    splits = source.create_splits("BATCH")
    assert [s["splitId"] for s in splits] == ["values-0", "values-1", "values-2", "nulls"]
    read = [row for split in splits for row in check_resumes(source, split, every=7)]
    assert sorted(read, key=lambda r: r[0]) == [(i, v, j) for i, v, j in values]
    texts = [r[1] for r in read if r[1] is not None]
    assert texts == sorted(texts)  # each range holds the values between its quantiles
    if database == "postgresql":  # json has no order
        error = plan_error(options, f"table = {table}, partition_column = j")
        assert (
            error["path"].endswith("partition_column") and "cannot be ordered" in error["message"]
        )
    error = plan_error(
        options, f"table = {table}, partition_column = varchar_col, partition_lower_bound = 1"
    )
    assert error["path"].endswith("partition_lower_bound")
    assert "needs an integer partition_column" in error["message"]
    error = plan_error(options, f"table = {table}, partition_column = nope")
    assert "is not a column of the rows" in error["message"]


PG_TYPES = {
    "x": ("xml", "'<a>1</a>'"),
    "ip": ("inet", "'10.1.2.3/16'"),
    "net": ("cidr", "'10.1.0.0/16'"),
    "mac": ("macaddr", "'08:00:2b:01:02:03'"),
    "span": ("interval", "'1 day 02:03:04'"),
    "cash": ("money", "12.34"),
    "bits": ("bit(3)", "B'101'"),
    "vbits": ("varbit", "B'1101'"),
    "tm": ("time", "'04:05:06.789'"),
    "tmz": ("timetz", "'04:05:06+02'"),
    "doc": ("tsvector", "'a fat cat'"),
    "mood": ("mood", "'happy'"),
    "pt": ("point", "'(1,2)'"),
    "box": ("box", "'((0,0),(1,1))'"),
    "ints": ("int[]", "'{1,NULL,3}'"),
    "words": ("text[]", "'{\"a b\",c}'"),
    "o": ("oid", "42"),
    "raw": ("bytea", "'\\x00ff'"),
}


def test_postgresql_types_without_a_mapping_are_read_as_their_text(pg):
    options, dsn = pg
    columns = ", ".join(f"{name} {pg_type}" for name, (pg_type, _) in PG_TYPES.items())
    pg_execute(
        dsn,
        "CREATE TYPE mood AS ENUM ('sad', 'happy')",
        f"CREATE TABLE odd (id int PRIMARY KEY, {columns})",
        f"INSERT INTO odd VALUES (1, {', '.join(v for _, v in PG_TYPES.values())})",
        "INSERT INTO odd (id) VALUES (2)",
    )
    with psycopg.connect(dsn) as conn:
        texts = conn.execute(
            f"SELECT id, {', '.join(f'{n}::text' for n in PG_TYPES if n != 'raw')}, raw"
            " FROM odd ORDER BY id"
        ).fetchall()
    for extra in ("table = odd", 'query = "select * from odd"'):
        source = source_of(options, extra)
        kinds = dict(source.output_schema().fields)
        assert kinds == {"id": "int", "raw": "bytes"} | {
            n: "string" for n in PG_TYPES if n != "raw"
        }
        rows = sorted(r for s in source.create_splits("BATCH") for r in rows_from(source, s))
        assert rows == [tuple(r) for r in texts], extra
    assert rows[0][1:3] == ("<a>1</a>", "10.1.2.3/16") and rows[0][-1] == b"\x00\xff"


def test_mysql_types_without_a_mapping_are_read(mariadb):
    table = f"t_{uuid.uuid4().hex[:8]}"
    mariadb.execute(
        f"CREATE TABLE {table} (id int PRIMARY KEY, u uuid, ip inet6, p point, g linestring)",
        f"INSERT INTO {table} VALUES (1, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '::1',"
        " ST_GeomFromText('POINT(1 2)'), ST_GeomFromText('LINESTRING(0 0, 1 1)')),"
        " (2, NULL, NULL, NULL, NULL)",
    )
    [(point,)] = mariadb.execute(f"SELECT p FROM {table} WHERE id = 1")
    source = source_of(mysql_options(mariadb), f"table = {table}")
    assert dict(source.output_schema().fields) == {
        "id": "int",
        "u": "string",
        "ip": "string",
        "p": "bytes",
        "g": "bytes",
    }
    rows = sorted(r for s in source.create_splits("BATCH") for r in rows_from(source, s))
    assert rows[0][:4] == (1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "::1", bytes(point))
    assert rows[1] == (2, None, None, None, None)
