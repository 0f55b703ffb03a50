"""LocalFile's managed reader emits the Arrow batches LocalFile reads: a block of a Lane B
batch's size at a time, cut into turns and handed over whole; a format or option pyarrow does
not read goes out as rows, converted by the task group once a step. Either way the records are
Lane B's, and a snapshot taken inside a block resumes exactly after what was emitted."""

from __future__ import annotations

import pyarrow as pa

from engine.connectors.batches import limits, to_rows
from engine.connectors.localfile import LocalFileSource
from engine.connectors.localfile_managed import ManagedLocalFileReader
from engine.member.step_batches import step_batches
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.reader import rows_of
from engine.states import JobMode
from tests.localfilekit import source_in
from tests.source_conformance import read_all, under_the_loop


def lane_b_rows(source: LocalFileSource) -> list[tuple]:
    """Every file's records as Lane B reads them, in split order."""
    return [
        row
        for split in source.create_splits(JobMode.BATCH)
        for batch, _ in source.read(split, 0, JobMode.BATCH, limits()[0])
        for row in to_rows(batch, source.output_schema())
    ]


def test_a_file_s_records_go_out_as_the_arrow_batches_lane_b_reads(tmp_path):
    big = limits()[0] + 3616
    (tmp_path / "a.csv").write_text("".join(f"{i},n{i}\n" for i in range(big)))
    (tmp_path / "b.csv").write_text("".join(f"{i},n{i}\n" for i in range(100, 110)))
    source = source_in(tmp_path)
    steps: list = []
    out, _ = under_the_loop(
        ManagedLocalFileReader(source, JobMode.BATCH),
        source.create_splits(JobMode.BATCH),
        every=10**9,
        on_part=steps.append,
    )
    assert all(isinstance(part, pa.RecordBatch) for part in steps)
    # The files take turns a block each, blocks handed over whole: a.csv's first is a step's
    # 256 turns; b.csv's and the rest of a.csv's go in the next step, a part each.
    assert [part.num_rows for part in steps] == [limits()[0], 10, 3616]
    lane_b = lane_b_rows(source)
    assert out == rows_of(steps) == lane_b[: limits()[0]] + lane_b[big:] + lane_b[limits()[0] : big]


def test_a_format_pyarrow_does_not_read_goes_out_as_rows_converted_once_a_step(tmp_path):
    (tmp_path / "a.txt").write_text("".join(f"{i}::n{i}\n" for i in range(300)))
    source = source_in(tmp_path, 'file_format_type = text, field_delimiter = "::",')
    steps: list = []
    out, _ = under_the_loop(
        ManagedLocalFileReader(source, JobMode.BATCH),
        source.create_splits(JobMode.BATCH),
        every=10**9,
        on_part=steps.append,
    )
    assert steps and all(isinstance(part, list) for part in steps)
    assert out == lane_b_rows(source) and len(out) == 300
    arrow = pa.schema([("id", pa.int32()), ("name", pa.string())])
    (batch,) = step_batches(steps, source.output_schema(), arrow)  # the task group's flush
    assert batch.num_rows == 300 and rows_of([batch]) == out


def test_a_snapshot_inside_a_block_resumes_exactly_after_what_was_emitted(tmp_path):
    total = limits()[0] + 500
    (tmp_path / "a.csv").write_text("".join(f"{i},n{i}\n" for i in range(total)))
    source = source_in(tmp_path)
    reader = ManagedLocalFileReader(source, JobMode.BATCH)
    splits = source.create_splits(JobMode.BATCH)
    out, snaps = under_the_loop(reader, splits, 97, PollLimits(max_records=16))
    assert out == lane_b_rows(source) and len(snaps) > 3
    inside = [(state, emitted) for state, emitted in snaps if 0 < emitted < limits()[0]]
    assert inside  # barriers between turns of the first block
    for state, emitted in [*inside[:2], *snaps[-2:]]:
        again = ManagedLocalFileReader(source, JobMode.BATCH)
        again.restore(state)
        again.notify_no_more_splits()
        assert out[:emitted] + read_all(again) == out
