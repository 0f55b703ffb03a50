"""A Jdbc sink following a source's schema change: its table gets the added columns, typed as
it would create them, on PostgreSQL and on MySQL (MariaDB); asked again (a restore) it changes
nothing; a custom query cannot follow and says so."""

from __future__ import annotations

import psycopg
import pytest

from engine.connectors.base import SchemaNotFollowed
from engine.jobs.planner import plan_job
from engine.member.dataplane import instantiate
from tests.mariadbkit import mariadb
from tests.test_jdbc_mysql import mysql_options
from tests.test_jobs_cluster import data_db

__all__ = ["data_db", "mariadb"]

ADDED = [("age", "bigint"), ("city", "string")]


def sink(options: str):
    config = (
        "source { FakeSource { schema { fields { id = bigint } } } }\n"
        f"sink {{ Jdbc {{ {options} }} }}"
    )
    return instantiate(plan_job(config).pipelines[0].to_json()["sinks"][0])


def test_a_postgresql_table_takes_the_columns_once(data_db):
    with psycopg.connect(data_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE evolving (id bigint)")
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    target = sink(f'url = "{url}", user = root, password = t, table = evolving')
    target.follow_schema(ADDED)
    target.follow_schema(ADDED)  # a restore asks again
    with psycopg.connect(data_db) as conn:
        columns = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = 'evolving' ORDER BY ordinal_position"
        ).fetchall()
    assert columns == [("id", "bigint"), ("age", "bigint"), ("city", "text")]


def test_a_mysql_table_takes_the_columns_once(mariadb):
    mariadb.execute("DROP TABLE IF EXISTS evolving", "CREATE TABLE evolving (id bigint)")
    target = sink(f"{mysql_options(mariadb)}, table = evolving")
    target.follow_schema(ADDED)
    target.follow_schema(ADDED)
    columns = mariadb.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'keel'"
        " AND table_name = 'evolving' ORDER BY ordinal_position"
    )
    assert [c[0] for c in columns] == ["id", "age", "city"]


def test_a_custom_query_cannot_follow(data_db):
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    target = sink(f'url = "{url}", user = root, password = t, query = "INSERT INTO t VALUES (?)"')
    with pytest.raises(SchemaNotFollowed, match="query names its fields"):
        target.follow_schema(ADDED)
