"""PostgreSQL to PostgreSQL: Keel's Jdbc -> Jdbc beside the pipes a user could write instead.

One table of ``(id bigint primary key, name text, amount double precision, ts timestamptz)``
is copied into an empty table of the same shape, in the same run on the same server:

- the ADBC pipe: ADBC's PostgreSQL driver reads the table into Arrow and ``adbc_ingest`` writes
  it (binary COPY both ways, in C++): the reference every ratio is to;
- a binary COPY pipe through psycopg (``COPY ... TO STDOUT`` blocks into ``COPY ... FROM STDIN``);
- dlt with its connectorx backend, when the ``bench`` extra is installed
  (``pip install -e '.[bench]'``);
- Keel: a batch job on a cluster (one master, one worker), at parallelism 1 and 2, with
  checkpoints off and every second (through the staging table, and with ``is_exactly_once =
  true``: prepared transactions), from its submission to FINISHED (the engine's clock).

The data lives on a PostgreSQL server of the bench's own (initdb in a temporary directory,
``max_prepared_transactions`` set, as two-phase commits need); the engine's database stays on
the shared server.

Every copy is checked: the target holds every source row once (count, and the sum of ids).
Then a copy of ``KEEL_BENCH_PG_RSS_ROWS`` rows (10,000,000) at parallelism 2 gives the worker's
peak RSS (the process's VmHWM, read before and after).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from tests.clusterkit import Cluster, DatabaseTemplate, run_batch_job
from tests.faultkit import PrivatePostgres

ROWS = int(os.environ.get("KEEL_BENCH_PG_ROWS", "1000000"))
RSS_ROWS = int(os.environ.get("KEEL_BENCH_PG_RSS_ROWS", "10000000"))
ROUNDS = int(os.environ.get("KEEL_BENCH_PG_ROUNDS", "3"))
DATABASE = "keel_bench_pg"
SHAPE = "(id bigint PRIMARY KEY, name text, amount double precision, ts timestamptz)"
GOALS = {"p2": 0.7, "p2-checkpointed": 0.5, "p2-prepared": 0.5}

JOB = """
env {{ job.mode = BATCH, parallelism = {parallelism}{checkpoint} }}
source {{ Jdbc {{ url = "{url}", user = postgres, password = bench, table = "public.src",
                 split.num = {parallelism} }} }}
sink {{ Jdbc {{ url = "{url}", user = postgres, password = bench, table = "public.dst"{sink} }} }}
"""

#: The data's server (set by main): a private one that allows prepared transactions.
SERVER: list[str] = []


def data_url() -> str:
    return f"{SERVER[0]}/{DATABASE}"


def prepare(rows: int) -> None:
    with psycopg.connect(f"{SERVER[0]}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    with psycopg.connect(data_url(), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE src {SHAPE}")
        conn.execute(
            "INSERT INTO src SELECT i, 'name-' || i, i * 0.5,"
            " timestamptz '2026-01-01 00:00:00+00' + i * interval '1 second'"
            " FROM generate_series(1, %s) AS i",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE src")
        conn.execute(f"CREATE TABLE dst {SHAPE}")


def reset_target() -> None:
    with psycopg.connect(data_url(), autocommit=True) as conn:
        conn.execute("TRUNCATE dst")
        conn.execute("CHECKPOINT")  # each copy starts from the same clean server


def check_target(rows: int, what: str) -> None:
    with psycopg.connect(data_url()) as conn:
        count, total = conn.execute("SELECT count(*), coalesce(sum(id), 0) FROM dst").fetchone()
    if count != rows or total != rows * (rows + 1) // 2:
        raise SystemExit(f"{what}: dst holds {count} rows (ids sum {total}); expected {rows}")


def adbc_pipe() -> float:
    import adbc_driver_postgresql.dbapi as adbc

    started = time.perf_counter()
    with adbc.connect(data_url()) as source, adbc.connect(data_url()) as target:
        with source.cursor() as read, target.cursor() as write:
            read.execute("SELECT * FROM src")
            write.adbc_ingest("dst", read.fetch_record_batch(), mode="append")
        target.commit()
    return time.perf_counter() - started


def copy_pipe() -> float:
    started = time.perf_counter()
    with psycopg.connect(data_url()) as source, psycopg.connect(data_url()) as target:
        with source.cursor().copy("COPY src TO STDOUT (FORMAT binary)") as out:
            with target.cursor().copy("COPY dst FROM STDIN (FORMAT binary)") as into:
                for block in out:
                    into.write(block)
        target.commit()
    return time.perf_counter() - started


def dlt_pipe() -> float | None:
    try:
        import dlt
        from dlt.sources.sql_database import sql_table
    except ImportError:
        return None
    started = time.perf_counter()
    # dlt asks for a password: the server trusts the loopback, so any will do.
    url = data_url().replace("postgres://postgres@", "postgresql://postgres:bench@")
    pipeline = dlt.pipeline(
        pipeline_name="keel_bench",
        destination=dlt.destinations.postgres(url),
        dataset_name="dlt_copy",
        pipelines_dir=tempfile.mkdtemp(prefix="keel-dlt-"),  # no state from an earlier run
    )
    pipeline.run(sql_table(credentials=url, table="src", backend="connectorx"))
    return time.perf_counter() - started


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def keel_copy(
    cluster: Cluster, parallelism: int, checkpoint_ms: int, prepared: bool = False
) -> float:
    url = "jdbc:" + data_url().replace("postgres://", "postgresql://").replace("postgres@", "")
    checkpoint = f", checkpoint.interval = {checkpoint_ms}" if checkpoint_ms else ""
    sink = ", is_exactly_once = true" if prepared else ""
    config = JOB.format(parallelism=parallelism, checkpoint=checkpoint, url=url, sink=sink)
    job_id = run_batch_job(cluster, config, "the copy job", timeout=900)
    return cluster.one(
        "SELECT extract(epoch FROM finished_at - created_at)::float8 FROM engine_job WHERE id = %s",
        (job_id,),
    )


def rate(rows: int, seconds: list[float]) -> float:
    return rows / statistics.median(seconds)


def main() -> None:
    server = PrivatePostgres({"max_prepared_transactions": 16}).start()
    SERVER.append(server.url)
    prepare(ROWS)
    times: dict[str, list[float]] = {}
    template = DatabaseTemplate()
    cluster = Cluster(template, masters=1, workers=1, slots=4)
    keel_runs = {
        "p1": (1, 0, False),
        "p2": (2, 0, False),
        "p2-checkpointed": (2, 1000, False),
        "p2-prepared": (2, 1000, True),
    }
    try:
        cluster.up()
        for _ in range(ROUNDS):  # alternating, so the machine's noise falls on every path
            for name, run in (("adbc", adbc_pipe), ("copy", copy_pipe)):
                reset_target()
                times.setdefault(name, []).append(run())
                check_target(ROWS, name)
            for name, (parallelism, checkpoint_ms, prepared) in keel_runs.items():
                reset_target()
                seconds = keel_copy(cluster, parallelism, checkpoint_ms, prepared)
                times.setdefault(name, []).append(seconds)
                check_target(ROWS, f"Keel {name}")
        dlt_seconds = dlt_pipe()  # into its own dataset (dlt_copy.src), not dst
        reference = rate(ROWS, times["adbc"])
        print(f"{ROWS:,} rows, median of {ROUNDS} alternating rounds (rows/s; ratio to ADBC):")
        labels = {
            "adbc": "ADBC pipe (read -> adbc_ingest)",
            "copy": "psycopg binary COPY pipe",
            "p1": "Keel Jdbc -> Jdbc, parallelism 1",
            "p2": "Keel Jdbc -> Jdbc, parallelism 2",
            "p2-checkpointed": "Keel, parallelism 2, a checkpoint every second (staging table)",
            "p2-prepared": "Keel, parallelism 2, a checkpoint every second, is_exactly_once"
            " (prepared transactions)",
        }
        for name, label in labels.items():
            value = rate(ROWS, times[name])
            goal = f" (goal >= {GOALS[name]:.1f})" if name in GOALS else ""
            runs = ", ".join(f"{ROWS / s:,.0f}" for s in times[name])
            print(f"  {label}: {value:,.0f} rows/s, {value / reference:.2f}x{goal} [{runs}]")
        if dlt_seconds is None:
            print("  dlt (connectorx): not installed (pip install -e '.[bench]' to compare)")
        else:
            value = ROWS / dlt_seconds
            keel = rate(ROWS, times["p2"])
            print(
                f"  dlt (connectorx backend): {value:,.0f} rows/s, {value / reference:.2f}x;"
                f" Keel p2 is {keel / value:.1f}x dlt (goal >= 3)"
            )
        if RSS_ROWS:
            prepare(RSS_ROWS)
            worker = cluster.pid("worker-1")
            before = peak_rss(worker)
            seconds = keel_copy(cluster, 2, 1000, prepared=True)
            check_target(RSS_ROWS, "the RSS copy")
            after = peak_rss(worker)
            print(
                f"{RSS_ROWS:,} rows at parallelism 2, checkpointed (prepared transactions):"
                f" {RSS_ROWS / seconds:,.0f}"
                f" rows/s; the worker's peak RSS {after / 2**20:.0f} MiB"
                f" (before the copy {before / 2**20:.0f} MiB; goal <= 400 MiB)"
            )
    finally:
        cluster.down()
        template.drop_all()
        server.__exit__(None, None, None)


if __name__ == "__main__":
    main()
