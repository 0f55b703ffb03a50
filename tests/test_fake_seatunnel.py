"""FakeSource counts and schemas as SeaTunnel's: ``row.num`` rows for each reader whatever
``split.num`` is, in both lanes and modes (STREAMING then idles; Keel's ``endless`` does not);
``schema.columns`` (defaults, vectors); its other options."""

from __future__ import annotations

import json
import math
import queue
import threading
import time

import pytest

from engine.connectors.batches import to_rows
from engine.connectors.fake import FakeSource, split_layout
from engine.connectors.fake_managed import ManagedFakeReader
from engine.jobconfig import ConfigError
from engine.jobs.planner import plan_job
from engine.member.dataplane import instantiate, run_reader
from engine.sourceruntime.choices import PollStatus
from engine.states import JobMode
from tests.localrun import run_batch
from tests.source_conformance import read_all, turn, under_the_loop


def source_of(options: str, env: str = "") -> FakeSource:
    plan = plan_job(
        f"env {{ {env} }}\nsource {{ FakeSource {{ {options} }} }}\nsink {{ Blackhole {{}} }}"
    )
    node = plan.pipelines[0].source
    return FakeSource(node.config, node.path)


def lane_b(source: FakeSource, mode: str = "BATCH") -> list[tuple]:
    return [
        row
        for split in source.create_splits(mode)
        for batch, _ in source.read(split, 0, mode, 4096)
        for row in to_rows(batch, source.output_schema())
    ]


def seatunnel_splits(readers: int, row_num: int, split_num: int) -> int:
    """How many splits SeaTunnel's FakeSourceSplitEnumerator makes (its loop, counted)."""
    size = math.ceil(row_num / split_num) if row_num else 1
    return readers * len(range(0, row_num, size))


@pytest.mark.parametrize("split_num", [1, 3, 7, 100, 250])
def test_parallelism_3_with_row_num_100_makes_300_rows_in_both_lanes(split_num):
    source = source_of(f"row.num = 100, split.num = {split_num}", "parallelism = 3")
    splits = source.create_splits("BATCH")
    assert len(splits) == seatunnel_splits(3, 100, split_num)
    rows = lane_b(source)
    assert len(rows) == 300 and sorted(r[0] for r in rows) == list(range(300))
    managed, _ = under_the_loop(ManagedFakeReader(source), splits, every=10**9)
    assert sorted(managed) == sorted(rows)


def test_splits_are_seatunnels_and_round_robin_gives_each_reader_its_own_rows():
    """Split ``k`` is SeaTunnel's split id ``k``, owned by reader ``k % parallelism``; reader
    ``r``'s splits hold the ids ``r * row.num ...``, the last split shorter."""
    layout = [(0, 3), (10, 3), (3, 3), (13, 3), (6, 3), (16, 3), (9, 1), (19, 1)]
    assert split_layout(2, 10, 4) == layout
    source = source_of("row.num = 10, split.num = 4, parallelism = 2")
    for k, split in enumerate(source.create_splits("BATCH")):
        ids = source.row_ids(split, "BATCH", 0, source.split_rows(split, "BATCH"))
        assert all(i // 10 == k % 2 for i in ids)
    assert split_layout(1, 0, 3) == [] and lane_b(source_of("row.num = 0")) == []


def test_listed_rows_come_once_per_split_and_the_default_row_num_is_five():
    rows = "schema { fields { id = int } }, rows = [{ fields = [1] }, { fields = [2] }]"
    assert len(lane_b(source_of(rows, "parallelism = 2"))) == 2 * 2  # one split a reader
    # row.num 5 (SeaTunnel's default) in split.num 3: splits of 2 rows, so 3 a reader.
    assert len(lane_b(source_of(f"{rows}, split.num = 3", "parallelism = 2"))) == 2 * 3 * 2
    assert len(lane_b(source_of(""))) == 5


def test_a_batch_job_writes_seatunnels_count(tmp_path):
    result = run_batch(
        "env { job.mode = BATCH, parallelism = 2 }\n"
        "source { FakeSource { row.num = 7, split.num = 3 } }\nsink { Blackhole { } }"
    )
    assert result["written"] == 14


COLUMNS = """schema = {
  table = "test.fakeTable"
  columns = [
    { name = id, type = bigint, nullable = false, comment = "key" }
    { name = name, type = string, defaultValue = "fixed", columnLength = 10 }
    { name = v, type = float_vector, columnScale = 3 }
    { name = h, type = float16_vector }
    { name = b, type = binary_vector, columnScale = 16 }
    { name = s, type = sparse_float_vector, columnScale = 2 }
    { name = nested, type = "map<string, {c_int = int, c_string = string}>" }
  ]
  primaryKey = { name = "primary key", columnNames = [id] }
  constraintKeys = [{ constraintName = u, constraintType = UNIQUE_KEY,
                      constraintColumns = [{ columnName = id, sortType = ASC }] }]
}"""


def test_schema_columns_with_defaults_vectors_and_keys(tmp_path):
    source = source_of(f"row.num = 2, vector.dimension = 5, {COLUMNS}")
    assert source.output_schema().fields == (
        ("id", "bigint"),
        ("name", "string"),
        ("v", "array<float>"),
        ("h", "array<float>"),
        ("b", "bytes"),
        ("s", "map<int, float>"),
        ("nested", "map<string, row<c_int: int, c_string: string>>"),
    )
    first = lane_b(source)[1]
    assert first[:5] == (1, "fixed", [0.5, 1.0, 1.5], [0.5, 1.0, 1.5, 2.0, 2.5], b"\x01\x02")
    assert first[5] == {0: 0.5, 1: 1.0}
    out = tmp_path / "out"
    result = run_batch(
        f"env {{ job.mode = BATCH }}\nsource {{ FakeSource {{ row.num = 3, {COLUMNS} }} }}\n"
        f'sink {{ LocalFile {{ path = "{out}", file_format_type = json }} }}'
    )
    assert result["written"] == 3 and result["warnings"] == []
    written = [json.loads(ln) for p in out.glob("*.jsonl") for ln in p.read_text().splitlines()]
    assert sorted(r["v"] for r in written)[2] == [1.0, 1.5, 2.0]


def test_seatunnels_other_options_are_taken_or_warned_about():
    plan = plan_job(
        "source { FakeSource { table-names = [a, b], vector.float.min = 0, vector.float.max = 1,"
        " auto.increment.enabled = true, binary.vector.dimension = 16,"
        ' schema { fields { v = binary_vector, r = "{a = int}" } } } }\nsink { Console { } }'
    )
    warned = {w["path"].rsplit(".FakeSource.", 1)[1] for w in plan.warnings}
    assert {"table-names", "vector.float.min", "auto.increment.enabled"} <= warned
    node = plan.pipelines[0].source
    assert lane_b(FakeSource(node.config, node.path))[0][0] == b"\x00\x01"  # 16 bits
    for bad, path in (
        ("binary.vector.dimension = 12", "binary.vector.dimension"),
        ("schema { columns = [{ name = a }] }", "schema.columns[0]"),
        ('schema { columns = [{ name = a, type = int, defaultValue = "x" }] }', "schema.columns"),
        ('schema { fields { r = "{a = int" } }', "schema.fields.r"),
    ):
        with pytest.raises(ConfigError) as refused:
            plan_job(f"source {{ FakeSource {{ {bad} }} }}\nsink {{ Console {{ }} }}")
        assert [e["path"] for e in refused.value.errors] == [f"source[0].FakeSource.{path}"]


def test_console_takes_multi_table_sink_replica_with_a_warning():
    plan = plan_job("source { FakeSource { } }\nsink { Console { multi_table_sink_replica = 2 } }")
    assert [w["path"] for w in plan.warnings] == ["sink[0].Console.multi_table_sink_replica"]


class StreamingReader:
    """One reader of a STREAMING FakeSource -> Blackhole job, in a thread through the data
    plane (``run_reader``) as a worker runs it: every boundary (after each batch, and each
    idle tick) reports how many rows the reader's splits have given so far."""

    def __init__(self, options: str, parallelism: int, index: int) -> None:
        plan = plan_job(
            f"env {{ job.mode = STREAMING, parallelism = {parallelism} }}\n"
            f"source {{ FakeSource {{ {options} }} }}\nsink {{ Blackhole {{ }} }}"
        )
        self.data = plan.pipelines[0].to_json()
        splits = instantiate(self.data["source"]).create_splits(JobMode.STREAMING)
        self.mine = [
            {"splitId": s["splitId"], "split": s, "offset": 0}
            for i, s in enumerate(splits)
            if i % parallelism == index
        ]
        self.index, self.stop, self.ticks = index, threading.Event(), queue.Queue()
        self.counters = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        self.counters = run_reader(
            self.data,
            self.mine,
            JobMode.STREAMING,
            {"jobId": 1, "pipelineId": 1, "readerIndex": self.index, "attempt": 1},
            self.stop,
            on_progress=lambda counters, current: None,
            on_split_done=lambda split_id, offset: None,
            on_boundary=lambda positions, chain: self.ticks.put(
                sum(p["offset"] for p in positions.values())
            ),
        )

    def rows_when(self, done, deadline: float = 30.0) -> int:
        """The rows read at the first boundary where ``done(rows)`` holds (within the
        deadline)."""
        until = time.monotonic() + deadline
        while True:
            rows = self.ticks.get(timeout=max(until - time.monotonic(), 0.001))
            if done(rows):
                return rows

    def end(self):
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        return self.counters


def test_streaming_gives_seatunnels_rows_then_idles_running_in_lane_b():
    """parallelism x row.num rows, as SeaTunnel's STREAMING FakeSource, then the readers idle
    without ending (the job stays RUNNING): their next boundaries see no more rows."""
    readers = [StreamingReader("row.num = 7, split.num = 3", 2, index) for index in range(2)]
    assert [r.rows_when(lambda rows: rows >= 7) for r in readers] == [7, 7]
    for reader in readers:
        later = [reader.rows_when(lambda rows: True) for _ in range(5)]  # idle ticks
        assert later == [7] * 5 and reader.thread.is_alive()
    assert [(c.received, c.written) for c in map(StreamingReader.end, readers)] == [(7, 7)] * 2


def test_streaming_with_endless_keeps_making_rows_past_row_num_in_lane_b():
    reader = StreamingReader("row.num = 7, endless = true", 1, 0)
    assert reader.rows_when(lambda rows: rows > 1000) > 1000
    assert reader.end().written > 1000


def test_streaming_gives_seatunnels_rows_then_nothing_available_in_lane_a():
    """Lane A's reader says NOTHING_AVAILABLE with no retry time once its splits are read:
    the event loop then waits for a command (no poll turns, no timer) while the job runs."""
    source = source_of("row.num = 7, split.num = 3", "job.mode = STREAMING, parallelism = 2")
    splits = source.create_splits(JobMode.STREAMING)
    rows = []
    for index in range(2):
        reader = ManagedFakeReader(source, JobMode.STREAMING)
        reader.add_splits(splits[index::2])
        reader.notify_no_more_splits()
        rows += read_all(reader)
        for _ in range(3):
            assert turn(reader) == (PollStatus.NOTHING_AVAILABLE, [])
            assert reader.retry_at is None
    assert sorted(r[0] for r in rows) == list(range(14))


def test_streaming_with_endless_keeps_making_rows_in_lane_a_as_before():
    """The endless splits are Keel's old STREAMING splits: split.num of them, ids
    ``s + i * split.num``."""
    source = source_of(
        "row.num = 7, split.num = 3, endless = true", "job.mode = STREAMING, parallelism = 2"
    )
    splits = source.create_splits(JobMode.STREAMING)
    assert len(splits) == 3 and source.split_rows(splits[0], JobMode.STREAMING) is None
    assert list(source.row_ids(splits[1], JobMode.STREAMING, 0, 3)) == [1, 4, 7]
    # A job planned before the option was (no key) keeps the endless splits it was made with.
    planned_before = {k: v for k, v in source.config.items() if k != "endless"}
    assert FakeSource(planned_before, source.path).create_splits(JobMode.STREAMING) == splits
    reader = ManagedFakeReader(source, JobMode.STREAMING)
    reader.add_splits(splits)
    reader.notify_no_more_splits()
    rows = [row for _ in range(20) for row in turn(reader)[1]]
    assert len(rows) > 1000 and len({r[0] for r in rows}) == len(rows)


def test_endless_is_refused_in_batch_and_with_listed_rows():
    for config, env in (
        ("endless = true", "job.mode = BATCH"),
        ("endless = true, schema { fields { id = int } }, rows = [{ fields = [1] }]", ""),
    ):
        with pytest.raises(ConfigError) as refused:
            source_of(config, env)
        assert [e["path"] for e in refused.value.errors] == ["source[0].FakeSource.endless"]
