"""The MySQL/MariaDB dialect on a private MariaDB: URLs and their parameters, every type read
into Keel and written back, splits that cover every row once, and the exactly-once writer's
fence (a stale attempt's commit moves nothing) and all-or-nothing commits."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pymysql
import pytest

from engine.connectors.batches import from_rows, to_rows
from engine.connectors.boundaries import Refused
from engine.connectors.mysql import source
from engine.connectors.mysql.sessions import connect
from engine.connectors.mysql.types import create_table_sql
from engine.connectors.mysql.urls import parse_url
from engine.connectors.mysql.writers import Fenced, MySqlExactlyOnceWriter, MySqlWriter
from engine.connectors.schema import Schema
from tests.mariadbkit import mariadb

__all__ = ["mariadb"]

#: Every MySQL type family, with the Keel type it is read as (SeaTunnel's mapping).
TYPES = {
    "b1": ("tinyint(1)", "boolean"),
    "ti": ("tinyint", "tinyint"),
    "tiu": ("tinyint unsigned", "smallint"),
    "si": ("smallint", "smallint"),
    "siu": ("smallint unsigned", "int"),
    "mi": ("mediumint", "int"),
    "i": ("int", "int"),
    "iu": ("int unsigned", "bigint"),
    "bi": ("bigint", "bigint"),
    "biu": ("bigint unsigned", "decimal(20, 0)"),
    "f": ("float", "float"),
    "d": ("double", "double"),
    "dc": ("decimal(30,10)", "decimal(30, 10)"),
    "wide": ("decimal(65,30)", "decimal(38, 18)"),
    "bit1": ("bit(1)", "boolean"),
    "bit5": ("bit(5)", "bytes"),
    "y": ("year", "int"),
    "dt": ("date", "date"),
    "dtm": ("datetime(6)", "timestamp"),
    "ts": ("timestamp(3) NULL", "timestamp"),
    "tm": ("time(6)", "time"),
    "j": ("json", "string"),
    "e": ("enum('red','green')", "string"),
    "st": ("set('x','y')", "string"),
    "ch": ("char(3)", "string"),
    "vc": ("varchar(20)", "string"),
    "tx": ("text", "string"),
    "bn": ("binary(4)", "bytes"),
    "vb": ("varbinary(10)", "bytes"),
    "bl": ("blob", "bytes"),
}
VALUES = (
    "1, -128, 255, -32768, 65535, -8388608, -2147483648, 4294967295, -9223372036854775808,"
    " 18446744073709551615, 1.5, 2.25, 12345678901234567890.0123456789, 1.123456789012345678,"
    " b'1', b'10101', 2024, '2024-02-29', '2024-01-02 03:04:05.123456',"
    " '2024-01-02 03:04:05.123', '23:59:59.5', '{\"a\": [1, \"x\\\\ty\"]}', 'green', 'x,y',"
    " 'ab', 'tab\\there\\nline \\\\ back', 'héllo ✓', x'00010203', x'0a0d09', x'5c00ff'"
)
CONTEXT = {"jobUuid": "", "pipelineId": 1, "readerIndex": 0, "checkpointing": True}


def _table(mariadb, columns: str) -> str:
    name = f"t_{uuid.uuid4().hex[:10]}"
    mariadb.execute(f"CREATE TABLE {name} ({columns})")
    return name


def _read_all(config: dict) -> list[tuple]:
    rows = []
    for split in source.create_splits(config):
        for batch, _ in source.read_split(config, split, 0, 1000):
            rows += to_rows(batch)
    return rows


def test_urls_map_connector_j_parameters_and_warn_about_the_rest():
    url = parse_url(
        "jdbc:mysql://db.example:3307/shop?useSSL=false&connectTimeout=2000&socketTimeout=9000"
        "&characterEncoding=UTF-8&serverTimezone=UTC&rewriteBatchedStatements=true"
        "&allowLoadLocalInfile=false&autoReconnect=true"
    )
    assert (url.host, url.port, url.database, url.ssl_mode) == (
        "db.example",
        3307,
        "shop",
        "DISABLED",
    )
    assert (url.connect_timeout, url.socket_timeout, url.charset) == (2.0, 9.0, "utf8mb4")
    assert (url.time_zone, url.local_infile) == ("+00:00", False)
    assert url.warnings == ["URL parameter autoReconnect has no effect here"]
    maria = parse_url("jdbc:mariadb://[::1]/db?sslMode=verify-full")
    assert (maria.scheme, maria.host, maria.port, maria.ssl_mode) == (
        "mariadb",
        "::1",
        3306,
        "VERIFY_IDENTITY",
    )
    for bad, message in (  # CREDENTIALS_ONLY: the message, and no part of the URL
        ("jdbc:mysql://h1,h2/db", "one host"),
        ("jdbc:mysql://root:pw@h/db", "credentials"),
        # A password's unencoded '/' or '?' splits the URL: no part of it is ever shown.
        ("jdbc:mysql://root:pa/zq7@h/db", CREDENTIALS_ONLY),
        ("jdbc:mysql://root:pa?zq7@h/db", CREDENTIALS_ONLY),
        ("jdbc:mysql://root:12/zq7@h/db", CREDENTIALS_ONLY),
        ("jdbc:mysql://root:12?zq7@h/db", CREDENTIALS_ONLY),
        ("jdbc:mysql://h/db?sslMode=sometimes", "sslMode"),
        ("jdbc:postgresql://h/db", "not a MySQL URL"),
    ):
        with pytest.raises(Refused, match=message):
            parse_url(bad)


def test_every_type_is_read_as_seatunnel_maps_it_and_written_back_unchanged(mariadb):
    columns = ", ".join(f"{name} {mysql}" for name, (mysql, _) in TYPES.items())
    table = _table(mariadb, f"id int PRIMARY KEY, {columns}")
    mariadb.execute(
        f"INSERT INTO {table} VALUES (1, {VALUES})", f"INSERT INTO {table} (id) VALUES (2)"
    )
    config = mariadb.config(table=table, query="")

    schema = source.output_schema(config)
    assert dict(schema.fields) == {"id": "int"} | {n: kind for n, (_, kind) in TYPES.items()}
    rows = _read_all(config)
    by_name = dict(zip(schema.names, sorted(rows)[0], strict=True))
    assert by_name["biu"] == Decimal("18446744073709551615")
    assert by_name["dc"] == Decimal("12345678901234567890.0123456789")
    assert by_name["wide"] == Decimal("1.123456789012345678")
    assert (by_name["b1"], by_name["bit1"], by_name["bit5"]) == (True, True, b"\x15")
    assert by_name["dtm"] == "2024-01-02T03:04:05.123456"
    assert (by_name["tm"], by_name["dt"], by_name["y"]) == ("23:59:59.500000", "2024-02-29", 2024)
    assert by_name["vc"] == "tab\there\nline \\ back" and by_name["tx"] == "héllo ✓"
    assert (by_name["bn"], by_name["vb"], by_name["bl"]) == (b"\0\1\2\3", b"\n\r\t", b"\\\0\xff")
    assert sorted(rows)[1][1:] == (None,) * len(TYPES)

    # MySQL -> Keel -> MySQL: a table of the same types gets the same rows, both write paths.
    for local_infile in ("true", "false"):
        copy = _table(mariadb, f"id int PRIMARY KEY, {columns}")
        url = f"{mariadb.url}?allowLoadLocalInfile={local_infile}"
        writer = MySqlWriter(mariadb.config(url=url, table=copy, query=""), schema, CONTEXT)
        for split in source.create_splits(config):
            for batch, _ in source.read_split(config, split, 0, 1000):
                writer.write(batch)
        writer.close()
        same = mariadb.execute(
            f"SELECT count(*) FROM (SELECT * FROM {table} EXCEPT SELECT * FROM {copy}) AS d"
        )
        assert same == [(0,)] and mariadb.execute(f"SELECT count(*) FROM {copy}") == [(2,)]


def test_keel_types_make_a_table_that_gives_them_back(mariadb):
    schema = Schema.from_json(
        [
            ["id", "bigint"],
            ["t", "tinyint"],
            ["s", "smallint"],
            ["i", "int"],
            ["f", "float"],
            ["d", "double"],
            ["n", "decimal(12, 3)"],
            ["txt", "string"],
            ["ok", "boolean"],
            ["raw", "bytes"],
            ["day", "date"],
            ["at", "time"],
            ["ts", "timestamp"],
            ["tags", "array<string>"],
            ["attrs", "map<string, int>"],
            ["pt", "row<x: int, y: string>"],
        ]
    )
    rows = [
        (
            1,
            -1,
            300,
            70000,
            0.5,
            1e300,
            Decimal("-12.345"),
            "a\tb\\n",
            True,
            b"\x00\\\n",
            "2024-02-29",
            "12:30:00.250000",
            "2024-03-01T10:11:12.654321",
            ["x", "y"],
            {"k": 1},
            (1, "p"),
        ),
        (2, *([None] * 15)),
    ]
    name = f"k_{uuid.uuid4().hex[:10]}"
    mariadb.execute(create_table_sql(f"`{name}`", schema, ["id"]))
    config = mariadb.config(table=name, query="")
    writer = MySqlWriter(config, schema, CONTEXT)
    writer.write(from_rows(rows, schema))
    writer.close()
    read_schema = source.output_schema(config)
    back = sorted(_read_all(config))
    assert [k for _, k in read_schema.fields][:13] == schema.kinds[:13]
    assert back[0][:13] == rows[0][:13] and back[1] == rows[1]
    assert back[0][13:] == ('["x", "y"]', '{"k": 1}', '{"x": 1, "y": "p"}')


@pytest.mark.parametrize("bounds", [(None, None), (100, 300), (-50, 5000)])
def test_splits_cover_every_row_once(mariadb, bounds):
    table = _table(mariadb, "id int PRIMARY KEY, part bigint NULL, v varchar(10)")
    mariadb.execute(
        f"INSERT INTO {table} SELECT seq, IF(seq % 10 = 0, NULL, CAST(seq AS SIGNED) * 3 - 500),"
        " concat('v', seq) FROM seq_1_to_1000"
    )
    low, high = bounds
    config = mariadb.config(
        table=table,
        query="",
        partition_column="part",
        **{"split.num": 7},
        partition_lower_bound=low,
        partition_upper_bound=high,
    )
    splits = source.create_splits(config)
    assert len(splits) == 8 and splits[-1]["splitId"] == "nulls"
    rows = _read_all(config)
    assert sorted(r[0] for r in rows) == list(range(1, 1001))
    # A resume from an offset inside a split reads exactly the rest.
    whole = [r for b, _ in source.read_split(config, splits[1], 0, 7) for r in to_rows(b)]
    rest = [r for b, _ in source.read_split(config, splits[1], 5, 7) for r in to_rows(b)]
    assert rest == whole[5:] and len(whole) > 5


def test_a_query_source_is_one_split_read_in_a_read_only_session(mariadb):
    table = _table(mariadb, "a int, b varchar(5)")
    mariadb.execute(f"INSERT INTO {table} VALUES (1, 'x'), (2, NULL), (2, 'y')")
    config = mariadb.config(query=f"SELECT a, b, a * 2 AS c FROM {table}", table="")
    assert source.output_schema(config).fields == (("a", "int"), ("b", "string"), ("c", "bigint"))
    assert sorted(_read_all(config), key=repr) == sorted(
        [(1, "x", 2), (2, None, 4), (2, "y", 4)], key=repr
    )
    with connect(config, read_only=True) as conn, conn.cursor() as cur:
        with pytest.raises(pymysql.MySQLError, match="READ ONLY"):
            cur.execute(f"DELETE FROM {table}")
    assert mariadb.execute(f"SELECT count(*) FROM {table}") == [(3,)]


CREDENTIALS_ONLY = "^put credentials in the user and password options, not in the URL$"
SCHEMA = Schema.from_json([["id", "bigint"], ["name", "string"]])


def _writer(mariadb, table: str, attempt: int, restored: int | None = None, **extra):
    context = CONTEXT | {
        "jobUuid": f"job-{table}",
        "attempt": attempt,
        "restoredCheckpoint": restored,
    }
    return MySqlExactlyOnceWriter(mariadb.config(table=table, query="", **extra), SCHEMA, context)


def _batch(*ids: int):
    return from_rows([(i, f"n{i}") for i in ids], SCHEMA)


def test_exactly_once_commits_checkpoints_and_fences_stale_attempts(mariadb):
    table = _table(mariadb, "id bigint PRIMARY KEY, name varchar(20) NOT NULL")
    old = _writer(mariadb, table, attempt=0)
    old.write(_batch(1, 2))
    first = old.prepare_commit(1)
    old.write(_batch(3))
    second = old.prepare_commit(2)
    old.write(_batch(4))
    assert mariadb.execute(f"SELECT count(*) FROM {table}") == [(0,)]  # staged only
    old.commit(first)
    assert mariadb.execute(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,)]
    old.commit(first)  # a second commit of the same checkpoint changes nothing

    # A new attempt restores checkpoint 2: it finishes 2's commit, drops the rest (row 4).
    new = _writer(mariadb, table, attempt=1, restored=2)
    assert mariadb.execute(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (3,)]
    with pytest.raises(Fenced):
        old.commit(second)
    with pytest.raises(Fenced):  # a zombie stages nothing after the fence
        old.write(_batch(9))
    new.write(_batch(5))
    new.commit(new.prepare_commit(3))
    assert mariadb.execute(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (3,), (5,)]
    new.close()
    old.abort()


def test_a_zombie_attempt_stages_nothing_a_later_restore_would_move(mariadb):
    table = _table(mariadb, "id bigint PRIMARY KEY, name varchar(20) NOT NULL")
    stage = f"{table}__keel_stage"
    zombie = _writer(mariadb, table, attempt=1)
    zombie.write(_batch(1, 2))
    zombie.commit(zombie.prepare_commit(1))
    # Attempt 2 takes over from checkpoint 1 while attempt 1 is frozen, then attempt 1 wakes.
    second = _writer(mariadb, table, attempt=2, restored=1)
    with pytest.raises(Fenced):
        zombie.write(_batch(3))
    with pytest.raises(Fenced):
        zombie.prepare_commit(2)
    with pytest.raises(Fenced):
        zombie.commit({"checkpoint": 2})
    assert mariadb.execute(f"SELECT count(*) FROM {stage} WHERE keel_attempt = 1") == [(0,)]
    second.write(_batch(4))
    second.commit(second.prepare_commit(2))
    second.abort()
    # Attempt 3 restores checkpoint 2: what attempt 2 committed, once, and nothing of the zombie.
    _writer(mariadb, table, attempt=3, restored=2).abort()
    assert mariadb.execute(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (4,)]
    zombie.abort()


def test_a_stage_follows_a_recreated_table_and_fits_a_long_table_name(mariadb):
    table = _table(mariadb, "id bigint PRIMARY KEY, name varchar(20) NOT NULL")
    _writer(mariadb, table, attempt=0).close()  # leaves the stage of the old shape
    # A save mode recreates the table with a new column and a wider one.
    mariadb.execute(
        f"DROP TABLE {table}",
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, name varchar(200), note text)",
    )
    wide = Schema.from_json([["id", "bigint"], ["name", "string"], ["note", "string"]])
    context = CONTEXT | {"jobUuid": f"job-{table}", "attempt": 1}
    writer = MySqlExactlyOnceWriter(mariadb.config(table=table, query=""), wide, context)
    writer.write(from_rows([(1, "x" * 150, "new")], wide))
    writer.close()
    assert mariadb.execute(f"SELECT length(name), note FROM {table}") == [(150, "new")]

    long_name = "t" + uuid.uuid4().hex + "_" * 22  # 55 characters: its stage needs a digest
    mariadb.execute(f"CREATE TABLE {long_name} (id bigint PRIMARY KEY, name varchar(20))")
    for attempt in (0, 1):  # the same stage every time
        writer = _writer(mariadb, long_name, attempt=attempt)
        writer.write(_batch(attempt))
        writer.close()
    assert mariadb.execute(f"SELECT id FROM {long_name} ORDER BY id") == [(0,), (1,)]
    [(stage,)] = mariadb.execute(
        "SELECT table_name FROM information_schema.tables"
        f" WHERE table_name LIKE '{long_name[:30]}%' AND table_name LIKE '%keel_stage'"
    )
    assert len(stage) == 64 and stage.startswith(long_name[:35])


def test_sessions_never_wait_long_for_a_lock_or_a_statement(mariadb):
    variables = (
        "@@lock_wait_timeout, @@innodb_lock_wait_timeout, @@max_statement_time, @@max_sort_length"
    )
    for options in ({}, {"program": "keel-savemode"}):
        with connect(mariadb.config(), **options) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT {variables}")
            assert [float(v) for v in cur.fetchone()] == [10, 10, 300, 8388608]
    # A split's read, and the scans that plan splits, last as long as the table is large.
    for options in ({"read_only": True}, {"read_only": True, "streaming": True}):
        with connect(mariadb.config(), **options) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT {variables}")
            assert [float(v) for v in cur.fetchone()] == [10, 10, 0, 8388608]


def test_a_commit_is_all_or_nothing(mariadb):
    table = _table(mariadb, "id bigint PRIMARY KEY, name varchar(20) NOT NULL")
    mariadb.execute(f"INSERT INTO {table} VALUES (3, 'there already')")
    writer = _writer(mariadb, table, attempt=0)
    writer.write(_batch(1, 2, 3, 4))  # 3 collides: no upsert keys, so the insert fails
    state = writer.prepare_commit(1)
    with pytest.raises(Exception, match="Duplicate"):
        writer.commit(state)
    assert mariadb.execute(f"SELECT id FROM {table}") == [(3,)]
    mariadb.execute(f"DELETE FROM {table}")
    writer.commit(state)  # retried once the conflict is gone: every row, once
    assert mariadb.execute(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,), (3,), (4,)]
    writer.abort()

    # With primary_keys the same rows are an upsert: the last row of a key wins.
    upsert = _writer(mariadb, table, attempt=0, primary_keys=["id"])
    upsert.write(from_rows([(1, "first"), (1, "second")], SCHEMA))
    upsert.close()
    assert mariadb.execute(f"SELECT name FROM {table} WHERE id = 1") == [("second",)]
