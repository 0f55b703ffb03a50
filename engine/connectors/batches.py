"""The data plane's unit: an Arrow record batch, bounded by rows and bytes.

Between a source and its sinks every batch is a ``pyarrow.RecordBatch`` whose columns are the
stream's fields, in order, typed as ``engine.connectors.arrowrows.arrow_type`` says. SeaTunnel's
row kind is a column of its own, ``ROW_KIND`` (int8: SeaTunnel's byte values), present only when
some row is not an INSERT, and always last. A connector written for rows keeps working through
``from_rows`` and ``to_rows`` (the base classes call them); one written for batches never
touches a Python row.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from django.conf import settings

from engine.connectors.arrowrows import rows_of, schema_of, to_table
from engine.connectors.schema import Schema, row_kind, with_kind

#: The row kind column's name, reserved: a stream's field must not be named so.
ROW_KIND = "__keel_row_kind"
#: SeaTunnel's RowKind byte values.
ROW_KINDS = {"INSERT": 0, "UPDATE_BEFORE": 1, "UPDATE_AFTER": 2, "DELETE": 3}
#: The rows a source written for rows (``read_rows``) makes at a time: Python rows cost per
#: row, so more gains nothing.
ROW_SOURCE_BATCH = 4096
KIND_NAMES = {code: name for name, code in ROW_KINDS.items()}


def limits() -> tuple[int, int]:
    """(rows, bytes) a batch holds at most (``engine.dataplane.batch-rows``/``-bytes``)."""
    return settings.ENGINE["dataplane.batch-rows"], settings.ENGINE["dataplane.batch-bytes"]


def data(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch without its row kind column (what a sink that knows no kinds writes)."""
    index = batch.schema.get_field_index(ROW_KIND)
    return batch if index < 0 else batch.remove_column(index)


def kinds(batch: pa.RecordBatch) -> pa.Array | None:
    """The row kind codes, or None when every row is an INSERT."""
    index = batch.schema.get_field_index(ROW_KIND)
    return None if index < 0 else batch.column(index)


def from_rows(rows: list[tuple], schema: Schema, arrow: pa.Schema | None = None) -> pa.RecordBatch:
    """Rows (Keel values, ``KindRow`` for a kind other than INSERT) as a batch."""
    table = to_table(rows, schema, arrow)
    batch = table.combine_chunks().to_batches()
    out = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=table.schema)
    if any(row_kind(r) != "INSERT" for r in rows):
        out = out.append_column(
            ROW_KIND, pa.array([ROW_KINDS[row_kind(r)] for r in rows], pa.int8())
        )
    return out


def to_rows(batch: pa.RecordBatch, schema: Schema | None = None) -> list[tuple]:
    """The batch's rows as Keel values (the row model's: ISO strings for times, tuples for
    nested rows), each a ``KindRow`` when its kind is not INSERT."""
    values = data(batch)
    schema = schema or schema_of(values.schema)
    rows = rows_of(pa.Table.from_batches([values]), schema)
    codes = kinds(batch)
    if codes is None:
        return rows
    return [with_kind(r, KIND_NAMES[c]) for r, c in zip(rows, codes.to_pylist(), strict=True)]


def bounded(batch: pa.RecordBatch, max_rows: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batch`` in slices of at most ``max_rows`` rows and about ``max_bytes`` bytes (a row
    wider than that is a batch of its own)."""
    rows = batch.num_rows
    if rows == 0:
        return
    size = batch.nbytes
    per_slice = max_rows
    if size > max_bytes:
        per_slice = min(per_slice, max(1, rows * max_bytes // size))
    if rows <= per_slice:
        yield batch
        return
    for start in range(0, rows, per_slice):
        yield batch.slice(start, per_slice)
