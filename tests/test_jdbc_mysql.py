"""The Jdbc source and sink on MySQL (a private MariaDB, tests/mariadbkit.py) through the
dialect layer, as jobs: planning and its errors, every MySQL type copied table to table,
PostgreSQL to MySQL and back, splits of both kinds, save modes and a named connection."""

from __future__ import annotations

import uuid
from decimal import Decimal

import psycopg
import pytest

from engine.connectors.jdbc import JdbcSource
from engine.jobconfig import ConfigError
from engine.jobs.planner import plan_job
from engine.models import Connection
from tests.localrun import run_batch
from tests.mariadbkit import PASSWORD, USER, mariadb
from tests.test_jobs_cluster import data_db
from tests.test_mysql_dialect import TYPES, VALUES

__all__ = ["data_db", "mariadb"]


def mysql_options(db, **extra: str) -> str:
    """A Jdbc block's connection options for the private MariaDB (SeaTunnel's spelling)."""
    options = {
        "url": f'"{db.url}"',
        "driver": '"com.mysql.cj.jdbc.Driver"',
        "username": USER,
        "password": PASSWORD,
    }
    return ", ".join(f"{k} = {v}" for k, v in (options | extra).items())


def new_table(db, columns: str, rows: str = "") -> str:
    name = f"t_{uuid.uuid4().hex[:10]}"
    db.execute(f"CREATE TABLE {name} ({columns})")
    if rows:
        db.execute(f"INSERT INTO {name} {rows}")
    return name


def numbers(db, count: int, far: int = 0) -> str:
    """A table ``(id bigint key, name, grp)`` of ids 1..count, plus ``far`` ids from 10^7."""
    table = new_table(db, "id bigint PRIMARY KEY, name varchar(40), grp int")
    with db.connect() as conn, conn.cursor() as cur:
        ids = [*range(1, count + 1), *range(10_000_000, 10_000_000 + far)]
        cur.executemany(
            f"INSERT INTO {table} VALUES (%s, %s, %s)", [(i, f"name-{i}", i % 7) for i in ids]
        )
    return table


def planning_error(config: str) -> dict:
    with pytest.raises(ConfigError) as caught:
        plan_job(config)
    [error] = caught.value.errors
    return error


def test_a_mysql_job_plans_and_bad_options_are_named(mariadb):
    table = numbers(mariadb, 10)
    mariadb.execute(f"CREATE TABLE {table}_copy LIKE {table}")
    plan = plan_job(
        f"""env {{ job.mode = BATCH }}
        source {{ Jdbc {{ {mysql_options(mariadb)}, table_path = "keel.{table}",
          partition_column = id, partition_num = 2 }} }}
        sink {{ Jdbc {{ url = "{mariadb.url}?autoReconnect=true",
          driver = "org.mariadb.jdbc.Driver", user = {USER}, password = {PASSWORD},
          table = "{table}_copy", primary_keys = [id] }} }}"""
    )
    assert plan.pipelines[0].source.config["table"] == table
    assert dict(plan.pipelines[0].source.schema) == {
        "id": "bigint",
        "name": "string",
        "grp": "int",
    }
    assert any("autoReconnect" in w["message"] for w in plan.warnings)

    source = f"source {{ Jdbc {{ {mysql_options(mariadb)}, table = {table}"
    sink = "sink { Blackhole {} }"
    for extra, option, words in (
        ("partition_column = nope", "partition_column", "not a column of the rows"),
        ('database = keel, table_path = "other.x"', "table_path", "the job's is 'keel'"),
        ('table_path = "a.b.c"', "table_path", "MySQL has no schemas"),
    ):
        error = planning_error(f"{source}, {extra} }} }}\n{sink}")
        assert error["path"].endswith(f"Jdbc.{option}") and words in error["message"], error
    error = planning_error(
        f"source {{ Jdbc {{ {mysql_options(mariadb)}, table = missing }} }}\n{sink}"
    )
    assert error["path"].endswith("Jdbc.table") and "no table 'missing'" in error["message"]
    error = planning_error(
        f'source {{ Jdbc {{ {mysql_options(mariadb)}, query = "select nope from {table}" }} }}'
        f"\n{sink}"
    )
    assert error["path"].endswith("Jdbc.query") and "nope" in error["message"]
    elsewhere = mysql_options(mariadb, url='"jdbc:mysql://10.9.9.9:3306/keel"')
    error = planning_error(f"source {{ Jdbc {{ {elsewhere}, table = {table} }} }}\n{sink}")
    assert error["path"].endswith("Jdbc.url") and "not allowed for jobs" in error["message"]
    error = planning_error(
        f"env {{ checkpoint.interval = 1000 }}\nsource {{ FakeSource {{ row.num = 1,"
        " schema = { fields { id = bigint } } } }\n"
        f'sink {{ Jdbc {{ {mysql_options(mariadb)}, query = "insert into {table} (id)'
        ' values (?)", is_exactly_once = true } }'
    )
    assert error["path"].endswith("Jdbc.is_exactly_once"), error


def test_every_mysql_type_is_copied_table_to_table_unchanged(mariadb):
    columns = ", ".join(f"{name} {mysql}" for name, (mysql, _) in TYPES.items())
    src = new_table(mariadb, f"id int PRIMARY KEY, {columns}")
    mariadb.execute(f"INSERT INTO {src} VALUES (1, {VALUES})", f"INSERT INTO {src} (id) VALUES (2)")
    for local_infile in ("true", "false"):  # LOAD DATA LOCAL, and multi-row INSERTs
        dst = new_table(mariadb, f"id int PRIMARY KEY, {columns}")
        result = run_batch(
            f"""env {{ job.mode = BATCH, parallelism = 2 }}
            source {{ Jdbc {{ {mysql_options(mariadb)}, table = {src}, split.num = 2 }} }}
            sink {{ Jdbc {{ {mysql_options(mariadb)}, table = {dst}, primary_keys = [id],
              properties = {{ allowLoadLocalInfile = {local_infile} }} }} }}"""
        )
        assert result["written"] == 2
        differ = mariadb.execute(
            f"SELECT count(*) FROM (SELECT * FROM {src} EXCEPT SELECT * FROM {dst}) AS d"
        )
        assert differ == [(0,)] and mariadb.execute(f"SELECT count(*) FROM {dst}") == [(2,)]


def pg_url(dsn: str) -> str:
    return "jdbc:" + dsn.replace("postgres://", "postgresql://")


def test_postgresql_to_mysql_and_back(mariadb, data_db):
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE src (id bigint PRIMARY KEY, name text, price numeric(10, 2),"
            " ratio double precision, ok boolean, at timestamp, raw bytea)"
        )
        conn.execute(
            "INSERT INTO src SELECT g, 'näme-' || g, g * 1.25, g / 4.0, g % 2 = 0,"
            " timestamp '2024-01-02 03:04:05.123456' + g * interval '1 hour',"
            " decode(lpad(to_hex(g), 4, '0'), 'hex') FROM generate_series(1, 300) g"
        )
    pg = f'url = "{pg_url(data_db)}", user = root, password = t'
    mid = f"m_{uuid.uuid4().hex[:8]}"
    result = run_batch(
        f"""env {{ job.mode = BATCH, parallelism = 2 }}
        source {{ Jdbc {{ {pg}, table = src, split.num = 3 }} }}
        sink {{ Jdbc {{ {mysql_options(mariadb)}, table = {mid}, primary_keys = [id] }} }}"""
    )
    assert result["written"] == 300
    row = mariadb.execute(
        f"SELECT id, name, price, ratio, ok, at, hex(raw) FROM {mid} WHERE id = 6"
    )
    assert row[0][:5] == (6, "näme-6", Decimal("7.50"), 1.5, 1)
    assert str(row[0][5]) == "2024-01-02 09:04:05.123456" and row[0][6] == "0006"

    result = run_batch(
        f"""env {{ job.mode = BATCH, parallelism = 2 }}
        source {{ Jdbc {{ {mysql_options(mariadb)}, table = {mid}, split.size = 50 }} }}
        sink {{ Jdbc {{ {pg}, table = back, primary_keys = [id] }} }}"""
    )
    assert result["written"] == 300
    with psycopg.connect(data_db) as conn:
        differ = conn.execute(
            "SELECT count(*) FROM (SELECT id, name, price, ratio, ok, at, raw FROM src"
            " EXCEPT SELECT id, name, price, ratio, ok, at, raw FROM back) AS d"
        ).fetchone()
        assert differ == (0,) and conn.execute("SELECT count(*) FROM back").fetchone() == (300,)


def test_splits_by_partition_bounds_and_by_split_size_read_every_row_once(mariadb):
    table = numbers(mariadb, 1000)
    dst = new_table(mariadb, "id bigint PRIMARY KEY, name varchar(40), grp int")
    result = run_batch(
        f"""env {{ job.mode = BATCH, parallelism = 3 }}
        source {{ Jdbc {{ {mysql_options(mariadb)},
          query = "select id, name, grp from {table} where name like 'name-%'",
          partition_column = id, partition_num = 5,
          partition_lower_bound = 100, partition_upper_bound = 800 }} }}
        sink {{ Jdbc {{ {mysql_options(mariadb)}, table = {dst} }} }}"""
    )
    assert result["received"] == 1000
    assert mariadb.execute(f"SELECT count(*), count(DISTINCT id) FROM {dst}") == [(1000, 1000)]

    config = (
        plan_job(
            f"source {{ Jdbc {{ {mysql_options(mariadb)}, table = {table}, split.size = 100,"
            " split.inverse-sampling.rate = 10 } }\nsink { Blackhole {} }"
        )
        .pipelines[0]
        .source.config
    )
    splits = JdbcSource(config, "s").create_splits("BATCH")
    assert len(splits) == 10  # 1000 evenly spread ids, 100 each
    mariadb.execute(f"INSERT INTO {table} SELECT id + 10000000, 'far', 0 FROM {table} LIMIT 500")
    splits = JdbcSource(config, "s").create_splits("BATCH")
    assert 14 <= len(splits) <= 16  # at the quantiles: about 100 rows each, not 1 of 1500
    sizes = [
        mariadb.execute(
            f"SELECT count(*) FROM {table} WHERE id >= {s['low']} AND id < {s['high']}"
        )[0][0]
        for s in splits
    ]
    assert sum(sizes) == 1500 and max(sizes) <= 200


def test_save_modes_create_the_table_and_drop_its_data(mariadb):
    table = numbers(mariadb, 20)
    created = f"c_{uuid.uuid4().hex[:8]}"
    source = f"source {{ Jdbc {{ {mysql_options(mariadb)}, table = {table} }} }}"
    run_batch(
        f"""{source}
        sink {{ Jdbc {{ {mysql_options(mariadb)}, table = {created}, primary_keys = [ID],
          schema_save_mode = CREATE_SCHEMA_WHEN_NOT_EXIST, field_ide = UPPERCASE }} }}"""
    )
    assert mariadb.execute(f"SELECT count(*), sum(GRP) FROM {created}") == [(20, Decimal(63))]
    keys = mariadb.execute(f"SHOW KEYS FROM {created} WHERE Key_name = 'PRIMARY'")
    assert [k[4] for k in keys] == ["ID"]

    mariadb.execute(f"INSERT INTO {created} VALUES (999, 'stale', 1)")
    run_batch(
        f"""{source}
        sink {{ Jdbc {{ {mysql_options(mariadb)}, table = {created}, field_ide = UPPERCASE,
          data_save_mode = DROP_DATA }} }}"""
    )
    assert mariadb.execute(f"SELECT count(*), max(ID) FROM {created}") == [(20, 20)]

    with pytest.raises(Exception, match="has rows"):
        run_batch(
            f"""{source}
            sink {{ Jdbc {{ {mysql_options(mariadb)}, table = {created},
              field_ide = UPPERCASE, data_save_mode = ERROR_WHEN_DATA_EXISTS }} }}"""
        )


@pytest.mark.django_db
def test_a_named_connection_reaches_mysql(mariadb):
    table = numbers(mariadb, 5)
    stored = Connection(name="shop", url=mariadb.url, user=USER)
    stored.set_password(PASSWORD)
    stored.save()
    dst = new_table(mariadb, "id bigint PRIMARY KEY, name varchar(40), grp int")
    result = run_batch(
        f"""source {{ Jdbc {{ connection = shop, table = {table} }} }}
        sink {{ Jdbc {{ connection = shop, table = {dst} }} }}"""
    )
    assert result["written"] == 5
    assert mariadb.execute(f"SELECT count(*) FROM {dst}") == [(5,)]
    # The job's properties would come after the admin's URL (TLS off): refused, by name.
    error = planning_error(
        f"""source {{ Jdbc {{ connection = shop, table = {table},
          properties {{ sslMode = DISABLED }} }} }}
        sink {{ Console {{}} }}"""
    )
    assert error["path"] == "source[0].Jdbc.properties"
    assert "named connection" in error["message"]


def test_a_job_may_name_another_database_and_a_user_without_a_password(mariadb):
    """SeaTunnel's MySQL files: ``table_path = "source.table1"`` and a sink's ``database`` beside
    a URL of another database (or of none), and root without a password."""
    suffix = uuid.uuid4().hex[:8]
    source_db, sink_db, user = f"src_{suffix}", f"snk_{suffix}", f"nopw_{suffix}"
    with mariadb.root() as conn, conn.cursor() as cur:
        for statement in (
            f"CREATE DATABASE {source_db}",
            f"CREATE DATABASE {sink_db}",
            f"CREATE TABLE {source_db}.t (id bigint PRIMARY KEY, name varchar(20))",
            f"INSERT INTO {source_db}.t SELECT seq, concat('n', seq) FROM keel.seq_1_to_25",
            f"CREATE USER '{user}'@'%'",
            f"GRANT ALL ON *.* TO '{user}'@'%'",
        ):
            cur.execute(statement)
    url = mariadb.url.rsplit("/", 1)[0]  # no database
    result = run_batch(
        f"""env {{ job.mode = BATCH }}
        source {{ Jdbc {{ url = "{url}/keel", user = {user}, password = "",
          table_path = "{source_db}.t" }} }}
        sink {{ Jdbc {{ url = "{url}", user = {user}, password = "",
          database = {sink_db}, table = t }} }}"""
    )
    assert result["written"] == 25
    assert mariadb.execute(f"SELECT count(*), min(name) FROM {sink_db}.t") == [(25, "n1")]
    # The database in ``table`` (no table_path) is the job's too, from planning to the rows.
    result = run_batch(
        f"""env {{ job.mode = BATCH }}
        source {{ Jdbc {{ url = "{url}/keel", user = {user}, password = "",
          table = "{source_db}.t" }} }}
        sink {{ Jdbc {{ url = "{url}/keel", user = {user}, password = "",
          table = "{sink_db}.t", data_save_mode = DROP_DATA }} }}"""
    )
    assert result["written"] == 25
    assert mariadb.execute(f"SELECT count(*) FROM {sink_db}.t") == [(25,)]


def test_an_enum_cannot_split_a_source(mariadb):
    table = new_table(
        mariadb, "id int PRIMARY KEY, kind enum('c', 'b', 'a')", "VALUES (1, 'a'), (2, 'c')"
    )
    error = planning_error(
        f"source {{ Jdbc {{ {mysql_options(mariadb)}, table = {table},"
        " partition_column = kind } }\nsink { Blackhole { } }"
    )
    assert error["path"].endswith("Jdbc.partition_column") and "is enum" in error["message"]
