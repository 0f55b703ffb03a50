"""The Sql transform beside FieldMapper doing the same projection, as a user sees them: the
chain FakeSource -> transform -> Blackhole on a real cluster, rows/s per slot (one reader), in
alternating rounds (goal: Sql at least 0.8 of FieldMapper).

The chain figure is the reader's rows divided by the time its data plane ran, by wall clock and
by the thread's CPU time (as bench/throughput measures). Before it, each transform's processor
alone over 65,536 FakeSource rows in Arrow batches (4 of 16,384) in the same process: FieldMapper
on a batch is a column select, so that ratio says what Sql costs, not what a job sees. Also a
projection with a computed column and a WHERE, which only Sql can express.
"""

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
from tests.clusterkit import Cluster, DatabaseTemplate, reader_rates, run_batch_job  # noqa: E402

BATCHES = 4
BATCH_SIZE = 16384
ROUNDS = 7
#: Rows of each chain job, and how many rounds of the two jobs alternate.
CHAIN_ROWS = 16_000_000
CHAIN_ROUNDS = 5
FIELDS = "schema { fields { id = bigint, name = string, score = double, flag = boolean } }"
SOURCE = f"""env {{ job.mode = BATCH }}
source {{ FakeSource {{ plugin_output = fake, row.num = 100000, {FIELDS} }} }}
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
#: The chains compared: the same projection.
CHAINS = ("FieldMapper", "Sql")


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


def transforms_alone() -> None:
    """Each transform's processor over the same batches, in alternating rounds."""
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
    print(
        f"the transform alone (its processor, no source or sink): {rows:,} rows in batches of "
        f"{BATCH_SIZE:,}, median of {ROUNDS} alternating rounds:"
    )
    for name, rate in median.items():
        print(f"  {name:<24} {rate:>14,.0f} rows/s")
    print(
        f"  ratio Sql / FieldMapper, the transform alone: "
        f"{median['Sql'] / median['FieldMapper']:.3f}"
    )


def chain_config(transform: str) -> str:
    """A one-reader job: FakeSource -> ``transform`` -> Blackhole."""
    return (
        "env { job.mode = BATCH, parallelism = 1 }\n"
        f"source {{ FakeSource {{ plugin_output = fake, row.num = {CHAIN_ROWS}, split.num = 1,"
        f" {FIELDS} }} }}\n"
        f"transform {{ {TRANSFORMS[transform]} }}\n"
        "sink { Blackhole { plugin_input = t } }"
    )


def chains() -> dict[str, list[tuple[float, float]]]:
    """(rows per wall second, rows per CPU second) of each chain's reader, round by round."""
    template = DatabaseTemplate()
    cluster = Cluster(template, masters=1, workers=1, slots=2)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in CHAINS}
    try:
        cluster.up()
        for _ in range(CHAIN_ROUNDS):
            for name in CHAINS:
                job_id = run_batch_job(cluster, chain_config(name), f"the {name} chain")
                runs[name].append(reader_rates(cluster, job_id, CHAIN_ROWS))
    finally:
        cluster.down()
        template.drop_all()
    return runs


def report_chains(runs: dict[str, list[tuple[float, float]]]) -> None:
    print(
        f"the chain FakeSource -> transform -> Blackhole on a cluster, per slot: {CHAIN_ROWS:,}"
        f" rows, median of {CHAIN_ROUNDS} alternating rounds:"
    )
    for index, label in ((0, "wall-clock"), (1, "CPU-time")):
        median = {name: statistics.median(r[index] for r in runs[name]) for name in CHAINS}
        print(
            f"  {label}: FieldMapper {median['FieldMapper']:,.0f} rows/s; "
            f"Sql {median['Sql']:,.0f} rows/s; "
            f"ratio Sql / FieldMapper {median['Sql'] / median['FieldMapper']:.3f} (goal >= 0.8)"
        )


def main() -> None:
    transforms_alone()
    report_chains(chains())


if __name__ == "__main__":
    main()
