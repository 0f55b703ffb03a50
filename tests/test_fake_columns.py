"""FakeSource's columns (``column_builder``) hold exactly the values of its rows
(``row_builder``): every id range a read makes, every string length, any field name."""

from __future__ import annotations

import pytest

from engine.connectors.batches import from_rows, to_rows
from engine.connectors.fake_values import Sizes, column_builder, row_builder
from engine.connectors.schema import Schema

SCHEMA = Schema(
    (
        ("id", "bigint"),
        ("name", "string"),
        ("value", "double"),
        ("n", "int"),
        ("f", "float"),
        ("num", "decimal"),
        ("flag", "boolean"),
        ("at", "timestamp"),
        ("naïve ☃", "string"),
    )
)
RANGES = [
    range(0),
    range(0, 25),
    range(5, 12_000),
    range(9_990, 10_020),
    range(99_995, 100_010),
    range(123_456_789, 123_456_789 + 20_000),
    range(3, 40_000, 3),  # STREAMING: split 3 of 3 splits
    range(7, 70_000, 7),
    range(1, 400_000, 100),  # a step beyond the runs' worth: Arrow formats each id
    range(2_147_470_000, 2_147_483_647),  # the largest ids an int field holds
]


@pytest.mark.parametrize("width", [None, 1, 3, 6, 8, 13, 40])
@pytest.mark.parametrize("ids", RANGES, ids=str)
def test_columns_hold_the_rows_values(ids, width):
    sizes = Sizes(string=width)
    batch = column_builder(SCHEMA, sizes)(ids)
    assert batch.num_rows == len(ids)
    batch.validate(full=True)
    rows = from_rows(row_builder(SCHEMA, sizes)(ids), SCHEMA)  # what the row path reads
    assert batch.schema == rows.schema
    assert to_rows(batch, SCHEMA) == to_rows(rows, SCHEMA)


def test_a_builder_serves_batches_of_any_size_in_turn():
    build = column_builder(Schema((("name", "string"),)))
    assert build(range(10_000, 10_003)).column(0).to_pylist() == [
        "name-10000",
        "name-10001",
        "name-10002",
    ]
    assert build(range(0, 16_384)).column(0).to_pylist()[-1] == "name-16383"
    assert build(range(5, 6)).column(0).to_pylist() == ["name-5"]


def test_kinds_it_does_not_build_go_through_rows():
    assert column_builder(Schema((("d", "decimal(10, 2)"),))) is None
    assert column_builder(Schema((("b", "bytes"),))) is None
