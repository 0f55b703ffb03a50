"""The Sql transform answers a query that only selects columns (``select a, b as c from dual``,
``select *``) with the batch's own columns, without DuckDB per batch: the same batch DuckDB
answers, for every kind, nulls and row kinds included; any other query is DuckDB's."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from engine.connectors.arrowrows import arrow_schema
from engine.connectors.batches import from_rows
from engine.connectors.schema import Schema, with_kind
from engine.connectors.sql import Sql

SCHEMA = Schema(
    (
        ("id", "bigint"),
        ("Name", "string"),
        ("amount", "decimal(12, 3)"),
        ("ts", "timestamp"),
        ("flag", "boolean"),
        ("score", "double"),
        ("small", "tinyint"),
        ("day", "date"),
    )
)
ROWS = [
    (
        1,
        "a",
        Decimal("1.500"),
        dt.datetime(2026, 12, 4, 1, 2, 3),
        True,
        1.5,
        1,
        dt.date(2026, 1, 1),
    ),
    with_kind((2, None, None, None, None, None, None, None), "UPDATE_AFTER"),
    with_kind(
        (3, "ç", Decimal("-0.001"), dt.datetime(1970, 1, 1), False, -0.0, -128, None), "DELETE"
    ),
]

PROJECTIONS = [
    "select id, Name as label from dual",
    "SELECT * FROM dual",
    "select name, ID from dual",  # DuckDB resolves names ignoring case
    "select d.id, d.amount as a from dual d",
    "select fake.ts as at, *, id as again from fake",
    "select amount, flag, score, small, day from dual;",
]
QUERIES = [
    "select id from dual where id > 1",
    "select distinct name from dual",
    "select id from dual limit 1",
    "select id from dual order by id desc",
    "select id + 1 as id from dual",
    "select cast(id as varchar) as id from dual",
    "with t as (select id from dual) select id from t",
    "select id from dual union all select id from dual",
    "select * exclude (ts) from dual",
    "select count(*) as n from dual",
    "select id, 'x' as tag from dual",
]


def answers(query: str, fast: bool):
    plugin = Sql({"query": query, "plugin_input": "fake"}, "transform[0].Sql")
    out = arrow_schema(plugin.output_schema(SCHEMA))
    took = plugin.projection(SCHEMA, out) is not None
    if not fast:
        plugin.projection = lambda schema, out: None  # DuckDB for every batch
    process = plugin.processor(SCHEMA)
    return took, process(from_rows(ROWS, SCHEMA))


@pytest.mark.parametrize("query", PROJECTIONS)
def test_a_choice_of_columns_is_the_batchs_own_columns_as_duckdb_answers(query):
    took, fast = answers(query, fast=True)
    _, duck = answers(query, fast=False)
    assert took
    assert fast.schema == duck.schema
    assert fast.equals(duck), query


@pytest.mark.parametrize("query", QUERIES)
def test_any_other_query_is_run_by_duckdb(query):
    took, _ = answers(query, fast=True)
    assert not took
