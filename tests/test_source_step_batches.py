"""A Lane A reader task group hands a step's records to its chain as one batch: a batch the
reader read goes as it is, rows are converted once a step, several parts are joined in order,
and parts of different schemas (a row kind column in some) go as one batch for each run."""

from __future__ import annotations

import pyarrow as pa

from engine.connectors.arrowrows import arrow_schema
from engine.connectors.batches import ROW_KIND, from_rows, to_rows
from engine.connectors.schema import Schema, with_kind
from engine.member.step_batches import step_batches

SCHEMA = Schema((("id", "bigint"), ("name", "string")))
ARROW = arrow_schema(SCHEMA)


def batch_of(ids: range) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(list(ids), pa.int64()), pa.array([f"n{i}" for i in ids])], schema=ARROW
    )


def test_a_step_of_one_batch_hands_that_batch_on_uncopied():
    batch = batch_of(range(100))
    (out,) = step_batches([batch], SCHEMA, ARROW)
    assert out is batch


def test_rows_and_batches_of_a_step_become_one_batch_in_their_order():
    rows = [(i, f"n{i}") for i in range(5)]
    parts = [rows[:2], batch_of(range(10, 13)), batch_of(range(20, 22)).slice(1), rows[2:]]
    (out,) = step_batches(parts, SCHEMA, ARROW)
    assert out.schema.equals(ARROW)
    read = [(10, "n10"), (11, "n11"), (12, "n12"), (21, "n21")]
    assert to_rows(out, SCHEMA) == [*rows[:2], *read, *rows[2:]]


def test_parts_of_another_schema_go_as_a_batch_of_their_own_in_order():
    deleted = [with_kind((7, "n7"), "DELETE")]
    parts = [batch_of(range(2)), batch_of(range(2, 4)), deleted, batch_of(range(4, 5))]
    out = step_batches(parts, SCHEMA, ARROW)
    assert [b.num_rows for b in out] == [4, 1, 1]
    assert ROW_KIND in out[1].schema.names and ROW_KIND not in out[0].schema.names
    assert to_rows(out[1], SCHEMA) == to_rows(from_rows(deleted, SCHEMA, ARROW), SCHEMA)
    assert [r[0] for b in out for r in to_rows(b, SCHEMA)] == [0, 1, 2, 3, 7, 4]
