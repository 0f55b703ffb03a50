"""The data plane's unit is an Arrow record batch: rows of every type of the type table go in
and come out as they were, row kinds ride as a column, and batches stay within their bounds."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from engine.connectors.batches import (
    ROW_KIND,
    bounded,
    data,
    from_rows,
    kinds,
    to_rows,
)
from engine.connectors.schema import Schema, row_kind, with_kind
from engine.connectors.transforms import Copy, FieldMapper, Filter, FilterRowKind

TYPES = Schema(
    (
        ("t", "tinyint"),
        ("s", "smallint"),
        ("i", "int"),
        ("b", "bigint"),
        ("f", "float"),
        ("d", "double"),
        ("dec", "decimal(20, 4)"),
        ("num", "decimal"),
        ("str", "string"),
        ("flag", "boolean"),
        ("raw", "bytes"),
        ("day", "date"),
        ("clock", "time"),
        ("at", "timestamp"),
        ("nothing", "null"),
        ("list", "array<int>"),
        ("dict", "map<string, double>"),
        ("nested", "row<a: int, b: string>"),
    )
)
ROW = (
    -8,
    300,
    70000,
    2**40,
    1.5,
    -2.25,
    Decimal("12345678.1234"),
    0.125,
    "naïve ☃",
    True,
    b"\x00\xff",
    "2026-12-04",
    "12:34:56.789000",
    "2026-12-04T01:02:03.456789",
    None,
    [1, None, 3],
    {"x": 1.5},
    (7, "seven"),
)


def test_rows_of_every_type_come_back_as_they_went_in():
    rows = [ROW, tuple(None for _ in ROW)]
    batch = from_rows(rows, TYPES)
    assert batch.num_rows == 2 and kinds(batch) is None  # all INSERT: no kind column
    assert to_rows(batch, TYPES) == rows


def test_row_kinds_ride_as_a_last_column_and_come_back():
    rows = [(1,), with_kind((2,), "DELETE"), with_kind((3,), "UPDATE_AFTER")]
    batch = from_rows(rows, Schema((("id", "bigint"),)))
    assert batch.schema.names == ["id", ROW_KIND]
    assert kinds(batch).to_pylist() == [0, 3, 2]  # SeaTunnel's byte values
    assert data(batch).schema.names == ["id"]
    back = to_rows(batch)
    assert back == [(1,), (2,), (3,)]
    assert [row_kind(r) for r in back] == ["INSERT", "DELETE", "UPDATE_AFTER"]


@pytest.mark.parametrize(
    "max_rows,max_bytes,sizes",
    [
        (4, 1 << 30, [4, 4, 2]),  # by rows
        (1000, 8 * 3, [3, 3, 3, 1]),  # by bytes: 8 bytes a row
        (1000, 1, [1] * 10),  # a row wider than the bound is a batch of its own
        (1000, 1 << 30, [10]),  # within both: the batch itself
    ],
)
def test_batches_stay_within_rows_and_bytes(max_rows, max_bytes, sizes):
    batch = pa.RecordBatch.from_pydict({"id": pa.array(range(10), pa.int64())})
    parts = list(bounded(batch, max_rows, max_bytes))
    assert [p.num_rows for p in parts] == sizes
    assert pa.Table.from_batches(parts).column("id").to_pylist() == list(range(10))


def processor(plugin, config: dict, schema: Schema):
    return plugin({"plugin_input": None, **config}, "transform[0]").processor(schema)


def test_column_transforms_keep_each_rows_kind():
    schema = Schema((("id", "bigint"), ("name", "string")))
    rows = [(1, "a"), with_kind((2, "b"), "DELETE"), (3, "c")]
    batch = from_rows(rows, schema)

    mapped = processor(FieldMapper, {"field_mapper": {"name": "who", "id": "key"}}, schema)(batch)
    assert mapped.schema.names == ["who", "key", ROW_KIND]
    assert [row_kind(r) for r in to_rows(mapped)] == ["INSERT", "DELETE", "INSERT"]

    kept = processor(Filter, {"include_fields": ["id"], "exclude_fields": None}, schema)(batch)
    assert to_rows(kept) == [(1,), (2,), (3,)] and kinds(kept) is not None

    copied = processor(Copy, {"fields": {"id2": "id"}, "src_field": None}, schema)(batch)
    assert to_rows(copied) == [(1, "a", 1), (2, "b", 2), (3, "c", 3)]
    assert copied.schema.names[-1] == ROW_KIND

    deletes = {"include_kinds": ["DELETE"], "exclude_kinds": None}
    assert to_rows(processor(FilterRowKind, deletes, schema)(batch)) == [(2, "b")]
    others = {"include_kinds": None, "exclude_kinds": ["DELETE"]}
    assert to_rows(processor(FilterRowKind, others, schema)(batch)) == [(1, "a"), (3, "c")]
    inserts_only = from_rows([(1, "a")], schema)
    assert processor(FilterRowKind, deletes, schema)(inserts_only).num_rows == 0
    assert processor(FilterRowKind, others, schema)(inserts_only).num_rows == 1


@pytest.mark.parametrize(
    "config",
    [
        "source { FakeSource { schema { fields { __keel_row_kind = int } } } }"
        " sink { Blackhole { } }",
        "source { FakeSource { schema { fields { id = int } } } }"
        " transform { FieldMapper { field_mapper { id = __keel_row_kind } } }"
        " sink { Blackhole { } }",
    ],
)
def test_a_field_named_as_the_row_kind_column_is_refused(config):
    from engine.jobconfig import ConfigError
    from engine.jobs.planner import plan_job

    with pytest.raises(ConfigError) as refused:
        plan_job("env { job.mode = BATCH }\n" + config)
    assert "__keel_row_kind is reserved" in str(refused.value.errors)
