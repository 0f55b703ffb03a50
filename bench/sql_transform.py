"""The Sql transform's throughput beside FieldMapper doing the same projection, in the same
process and run: 65,536 FakeSource rows as Arrow batches (4 of 16,384 rows), each transform's
processor timed over them in alternating rounds. Also a projection with a computed
column and a WHERE, which only Sql can express."""

from __future__ import annotations

import os
import statistics
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")
django.setup()

from engine.connectors.schema import Schema  # noqa: E402 - after django.setup()
from engine.jobs.planner import plan_job  # noqa: E402
from engine.member.dataplane import instantiate  # noqa: E402

BATCHES = 4
BATCH_SIZE = 16384
ROUNDS = 7
SOURCE = """env { job.mode = BATCH }
source { FakeSource { plugin_output = fake, row.num = 100000,
  schema { fields { id = bigint, name = string, score = double, flag = boolean } } } }
"""
TRANSFORMS = {
    "FieldMapper": "FieldMapper { plugin_input = fake, plugin_output = t,"
    " field_mapper { id = id, name = label } }",
    "Sql": "Sql { plugin_input = fake, plugin_output = t,"
    ' query = "select id, name as label from dual" }',
    "Sql (computed, WHERE)": "Sql { plugin_input = fake, plugin_output = t,"
    ' query = "select id, upper(name) as label, score * 2 as double_score from dual'
    ' where id % 2 = 0" }',
}


def processor(transform: str):
    sink = "sink { Blackhole { plugin_input = t } }"
    plan = plan_job(f"{SOURCE}transform {{ {transform} }}\n{sink}", None, {})
    pipeline = plan.pipelines[0].to_json()
    source = instantiate(pipeline["source"])
    node = pipeline["transforms"][0]
    fn = instantiate(node).processor(Schema.from_json(pipeline["source"]["schema"]))
    return source, fn


def batches(source) -> list:
    """BATCHES Arrow batches of BATCH_SIZE rows of the source's first split."""
    import pyarrow as pa

    split = source.create_splits("BATCH")[0]
    parts, rows = [], 0
    for batch, _ in source.read(split, 0, "BATCH", BATCH_SIZE):
        parts.append(batch)
        rows += batch.num_rows
        if rows >= BATCHES * BATCH_SIZE:
            break
    table = pa.Table.from_batches(parts).combine_chunks()
    return table.to_batches(max_chunksize=BATCH_SIZE)[:BATCHES]


def timed(fn, data: list) -> float:
    """Rows per second of ``fn`` over the batches."""
    started = time.perf_counter()
    for batch in data:
        fn(batch)
    return sum(b.num_rows for b in data) / (time.perf_counter() - started)


def main() -> None:
    source, _ = processor(TRANSFORMS["FieldMapper"])
    data = batches(source)
    fns = {name: processor(text)[1] for name, text in TRANSFORMS.items()}
    for fn in fns.values():
        fn(data[0])  # warm: DuckDB's connection, compiled getters
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            runs[name].append(timed(fn, data))
    median = {name: statistics.median(r) for name, r in runs.items()}
    rows = sum(b.num_rows for b in data)
    print(f"{rows:,} rows in batches of {BATCH_SIZE:,}, median of {ROUNDS} alternating rounds:")
    for name, rate in median.items():
        print(f"  {name:<24} {rate:>14,.0f} rows/s")
    print(
        f"ratio Sql / FieldMapper (the same projection): "
        f"{median['Sql'] / median['FieldMapper']:.3f}"
    )


if __name__ == "__main__":
    main()
