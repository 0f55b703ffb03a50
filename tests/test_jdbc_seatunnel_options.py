"""The Jdbc connector with more of SeaTunnel's options, on a real PostgreSQL database of the
test's own: pgJDBC URLs with parameters, table_list, split.size, the sink's schema, a query
beside its table_path, save modes, and the refusal of other databases."""

from __future__ import annotations

import psycopg
import pytest

from engine.connectors.boundaries import Refused, check_database
from engine.connectors.jdbc import JdbcSource
from engine.connectors.jdbc_url import parse_jdbc_url
from engine.connectors.pg_url import pg_target, session_params
from engine.jobconfig import ConfigError
from engine.jobs.planner import plan_job
from tests.localrun import run_batch
from tests.test_jdbc_options import conn_options, count, db
from tests.test_jobs_cluster import data_db

__all__ = ["data_db", "db"]


@pytest.fixture
def tables(db):
    """test_jdbc_options' database (src: 1000 rows, schema other), with a small table and a
    table in schema other."""
    url, database, dsn = db
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE two (id int PRIMARY KEY, label text)")
        conn.execute("INSERT INTO two SELECT g, 'l' || g FROM generate_series(1, 30) g")
        conn.execute("CREATE TABLE other.src (id bigint PRIMARY KEY, name text)")
        conn.execute("INSERT INTO other.src VALUES (1, 'in other')")
    return url, database, dsn


# -- URLs ---------------------------------------------------------------------------------------


def test_pgjdbc_urls_parse_with_host_lists_ipv6_and_no_port_or_database():
    url = parse_jdbc_url("jdbc:postgresql://h1:5432,[::1]:5433,h3/db?a=1&b=x%20y")
    assert url.subprotocol == "postgresql" and url.database == "db"
    assert url.hosts == (("h1", "5432"), ("::1", "5433"), ("h3", ""))
    assert url.params == (("a", "1"), ("b", "x y"))
    assert parse_jdbc_url("jdbc:postgresql://h?x=1").database == ""
    assert parse_jdbc_url("jdbc:postgresql:db").hosts == (("localhost", ""),)
    with pytest.raises(ValueError, match="IPv6"):
        parse_jdbc_url("jdbc:postgresql://::1:5432/db")


def test_parameters_with_a_libpq_meaning_are_mapped_and_the_rest_warned_about():
    target = pg_target(
        "jdbc:postgresql://localhost:5432/db?loggerLevel=OFF&stringtype=unspecified"
        "&currentSchema=my%20s&sslmode=require&ApplicationName=a&connectTimeout=7"
        "&targetServerType=primary&user=u&password=p&madeUp=1&options=-c%20work_mem=8MB"
    )
    assert (target.user, target.password) == ("u", "p")
    params = session_params(target.libpq, "-c default_transaction_read_only=on")
    assert params["sslmode"] == "require" and params["connect_timeout"] == "7"
    assert params["target_session_attrs"] == "primary"
    # The URL's options first, Keel's last (they win): a job cannot undo a read-only session.
    assert params["options"] == (
        "-c work_mem=8MB -c search_path=my\\ s -c default_transaction_read_only=on"
    )
    warned = dict(target.warnings)
    assert set(warned) == {"loggerLevel", "stringtype", "ApplicationName", "madeUp"}
    assert all(m.startswith("no effect") for m in warned.values())


def test_certificate_files_outside_the_file_roots_are_refused():
    with pytest.raises(Refused, match=r"sslrootcert.*outside the file roots"):
        check_database("jdbc:postgresql://localhost/db?sslrootcert=/etc/passwd")


def test_every_host_of_a_list_must_be_allowed():
    assert check_database("jdbc:postgresql://127.0.0.1:1,localhost:2/x")["port"] == "1,2"
    with pytest.raises(Refused, match=r"elsewhere\.example:5432/x is not allowed"):
        check_database("jdbc:postgresql://127.0.0.1/x,elsewhere.example/x".replace("/x,", ","))


SINK_PARAMETERS = "?stringtype=unspecified&reWriteBatchedInserts=true&currentSchema=other"


def test_a_parameterised_url_plans_warns_per_parameter_and_sets_the_schema(tables):
    url, _, dsn = tables
    result = run_batch(
        f"""source {{ Jdbc {{ {conn_options(url + "?loggerLevel=OFF&currentSchema=other")},
          query = "select id, name from src" }} }}
        sink {{ Jdbc {{ {conn_options(url + SINK_PARAMETERS)},
          table = copied, primary_keys = [id] }} }}"""
    )
    assert result["received"] == 1  # other.src: the unqualified name went by currentSchema
    assert count(dsn, "SELECT count(*) FROM other.copied WHERE name = 'in other'") == 1
    warned = {(w["path"].split(".", 1)[1], w["message"].split(":")[0]) for w in result["warnings"]}
    assert warned == {
        ("Jdbc.url", "loggerLevel"),
        ("Jdbc.url", "stringtype"),
        ("Jdbc.url", "reWriteBatchedInserts"),
    }


def test_other_databases_are_refused_as_unavailable_here(tables):
    url, _, _ = tables
    for driver, message in (
        ("oracle.jdbc.OracleDriver", "driver oracle.jdbc.OracleDriver (Oracle) is not available"),
        ("com.mysql.cj.jdbc.Driver", "is MySQL's driver, the url is PostgreSQL's"),
    ):
        with pytest.raises(ConfigError) as caught:
            plan_job(
                f'source {{ Jdbc {{ url = "{url}", user = u, password = p, table = src,'
                f' driver = "{driver}" }} }}\nsink {{ Blackhole {{}} }}'
            )
        [error] = caught.value.errors
        assert error["path"].endswith(".driver") and message in error["message"], error
    with pytest.raises(ConfigError, match="reads and writes PostgreSQL and MySQL/MariaDB"):
        plan_job(
            'source { Jdbc { url = "jdbc:sqlserver://h:1433;databaseName=d", user = u,'
            " password = p, table = t } }\nsink { Blackhole {} }"
        )


# -- the source ---------------------------------------------------------------------------------


def test_table_list_makes_a_pipeline_per_table_and_names_each_sink_s_table(tables):
    url, database, dsn = tables
    result = run_batch(
        f"""source {{ Jdbc {{ {conn_options(url)}, split.inverse-sampling.rate = 100,
          table_list = [
            {{ table_path = "{database}.public.src", partition_column = id, partition_num = 3 }},
            {{ table_path = "public.two", query = "select id, label from two where id <= 10" }}
          ] }} }}
        sink {{ Jdbc {{ {conn_options(url)}, schema = "${{schema_name}}",
          table = "copy_${{table_name}}" }} }}"""
    )
    assert result["received"] == 1000 + 10
    assert count(dsn, "SELECT count(*) FROM public.copy_src") == 1000
    assert count(dsn, "SELECT count(*) FROM public.copy_two") == 10
    plan = plan_job(
        f"""source {{ Jdbc {{ {conn_options(url)}, table_list = [
          {{ table_path = "public.src", partition_num = 2 }}, {{ table_path = "public.two" }}
        ] }} }}\nsink {{ Blackhole {{}} }}"""
    )
    assert [p.source.config["split.num"] for p in plan.pipelines] == [2, 4]
    assert [p.sinks[0].path for p in plan.pipelines] == [
        f"sink[0].Blackhole@{database}.public.src",
        f"sink[0].Blackhole@{database}.public.two",
    ]


def test_split_size_cuts_the_key_into_chunks_even_or_at_its_quantiles(tables):
    url, _, dsn = tables
    plan = plan_job(
        f"source {{ Jdbc {{ {conn_options(url)}, table = src, split.size = 100,"
        " split.inverse-sampling-rate = 10 } }\nsink { Blackhole {} }"
    )
    config = plan.pipelines[0].source.config
    assert config["split.inverse-sampling.rate"] == 10  # the docs' spelling too
    splits = JdbcSource(config, "s").create_splits("BATCH")
    assert len(splits) == 10  # 1000 evenly spread rows, 100 each
    with psycopg.connect(dsn, autocommit=True) as conn:  # 500 rows far out: uneven
        conn.execute(
            "INSERT INTO src SELECT g, 'far', 0 FROM generate_series(10000000, 10000499) g"
        )
    splits = JdbcSource(config, "s").create_splits("BATCH")
    assert 14 <= len(splits) <= 16  # at the quantiles: about 100 rows each, not 1 of 1500
    sizes = [
        count(dsn, f"SELECT count(*) FROM src WHERE id >= {s['low']} AND id < {s['high']}")
        for s in splits
    ]
    assert sum(sizes) == 1500 and max(sizes) <= 200


def test_a_query_beside_its_table_path_is_what_is_read(tables):
    url, database, dsn = tables
    result = run_batch(
        f"""source {{ Jdbc {{ {conn_options(url)}, table_path = "{database}.public.src",
          query = "select id, name from src where id <= 5", split.size = 10 }} }}
        sink {{ Jdbc {{ {conn_options(url)}, table = "from_query" }} }}"""
    )
    assert result["written"] == 5
    assert count(dsn, "SELECT count(*) FROM from_query") == 5


# -- save modes ---------------------------------------------------------------------------------


def sink_job(url: str, sink: str, query: str = "select id, name from src where id <= 10") -> str:
    return (
        f'source {{ Jdbc {{ {conn_options(url)}, query = "{query}" }} }}\n'
        f"sink {{ Jdbc {{ {conn_options(url)}, {sink} }} }}"
    )


def test_a_missing_table_is_created_with_its_primary_key_and_recreated_on_demand(tables):
    url, _, dsn = tables
    run_batch(sink_job(url, "table = made, primary_keys = [id]"))
    run_batch(sink_job(url, "table = made, primary_keys = [id]"))  # an upsert: still 10
    assert count(dsn, "SELECT count(*) FROM made") == 10
    with psycopg.connect(dsn) as conn:
        key = conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_index i JOIN "
            "pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = 'made'::regclass AND i.indisprimary"
        ).fetchall()
    assert key == [("id", "bigint")]
    run_batch(
        sink_job(url, "table = made, schema_save_mode = RECREATE_SCHEMA", "select id from src")
    )
    assert count(dsn, "SELECT count(*) FROM made") == 1000
    assert (
        count(dsn, "SELECT count(*) FROM information_schema.columns WHERE table_name = 'made'") == 1
    )  # only the incoming field


def test_data_save_modes_empty_refuse_or_run_custom_sql_before_the_first_row(tables):
    url, _, dsn = tables
    run_batch(sink_job(url, "table = two, data_save_mode = DROP_DATA", "select 99 as id"))
    assert count(dsn, "SELECT count(*) FROM two") == 1
    with pytest.raises(Exception, match="has rows"):
        run_batch(
            sink_job(url, "table = two, data_save_mode = ERROR_WHEN_DATA_EXISTS", "select 1 as id")
        )
    run_batch(
        sink_job(
            url,
            'table = two, data_save_mode = CUSTOM_PROCESSING, custom_sql = "delete from two'
            " where id = 99; insert into two values (-1, 'custom')\"",
            "select 5 as id",
        )
    )
    assert count(dsn, "SELECT count(*) FROM two") == 2  # -1 from custom_sql, then 5


@pytest.mark.parametrize(
    "sink,path,message",
    [
        ("table = nope, schema_save_mode = ERROR_WHEN_SCHEMA_NOT_EXIST", "table", "no table"),
        ("table = nope, schema_save_mode = sometimes", "schema_save_mode", "must be one of"),
        ("table = two, data_save_mode = CUSTOM_PROCESSING", "custom_sql", "is required"),
        ("table = nope, primary_keys = [nokey]", "primary_keys", "has no column(s) nokey"),
        ('table = "public.two", schema = other', "schema", "another schema"),
    ],
)
def test_bad_save_modes_are_400s_that_name_the_option(tables, sink, path, message):
    url, _, dsn = tables
    with pytest.raises(ConfigError) as caught:
        plan_job(sink_job(url, sink))
    errors = caught.value.errors
    assert any(e["path"].endswith(path) and message in e["message"] for e in errors), errors
    assert (
        count(dsn, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'nope'") == 0
    )
