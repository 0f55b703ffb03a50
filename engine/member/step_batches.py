"""A Lane A reader step's records as the batches its task group hands to the chain.

The reader event loop hands a step's records over part by part (``PollContext.settle``): record
batches as the reader read them (usually one a step: the block its turns were cut from), and
lists of rows from a reader that makes rows. The chain gets one batch a step: rows are converted
once (``from_rows``), and several parts are joined with ``pyarrow.concat_batches``, which costs
less than handing each on (measured: 256 turns' batches of 64 rows concatenated and delivered
into Blackhole, 0.2 ms; delivered one by one, 2.5 ms, each measured and written on its own).
"""

from __future__ import annotations

import pyarrow as pa

from engine.connectors.batches import from_rows
from engine.connectors.schema import Schema


def step_batches(parts: list, schema: Schema, arrow: pa.Schema) -> list[pa.RecordBatch]:
    """The step's parts (record batches, lists of rows) as batches, in order: one, unless parts
    differ in schema (a row kind column in some), then one for each run of one schema."""
    batches = [from_rows(p, schema, arrow) if isinstance(p, list) else p for p in parts]
    if len(batches) < 2:
        return batches
    runs = [[batches[0]]]
    for batch in batches[1:]:
        if batch.schema.equals(runs[-1][0].schema):
            runs[-1].append(batch)
        else:
            runs.append([batch])
    return [run[0] if len(run) == 1 else pa.concat_batches(run) for run in runs]
