"""Which LocalFile files start a schema change, and with what columns: Parquet and ORC as the
file types them, JSON lines from the first record, CSV by its header; files that name no
columns, ``read_columns`` and the partition's fields never do. A managed reader asks before it
emits any record of such a file, reads it with the new schema once the change applied, and
without ``schema-changes.enabled`` reads as before."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

from engine.connectors.localfile_columns import added_columns, file_columns
from engine.connectors.localfile_managed import ManagedLocalFileReader
from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.poll_context import PollContext
from engine.states import JobMode
from tests.localfilekit import source_in

OLD = [("id", "bigint"), ("name", "string")]


def test_each_format_names_its_columns(tmp_path):
    table = pa.table({"id": [1], "name": ["a"], "score": [0.5]})
    pq.write_table(table, tmp_path / "a.parquet")
    orc.write_table(table, tmp_path / "a.orc")
    (tmp_path / "a.json").write_text('\n{"id": 1, "name": "a", "ok": true, "n": 2.5}\n')
    (tmp_path / "a.csv").write_text("skip me\nid,name,city\n1,a,x\n")
    (tmp_path / "b.csv").write_text("1,a,x\n")
    parquet = {"file_format_type": "parquet"}
    assert file_columns(tmp_path / "a.parquet", parquet)[-1] == ("score", "double")
    assert file_columns(tmp_path / "a.orc", {"file_format_type": "orc"})[-1] == ("score", "double")
    assert file_columns(tmp_path / "a.json", {"file_format_type": "json"}) == [
        ("id", "bigint"),
        ("name", "string"),
        ("ok", "boolean"),
        ("n", "double"),
    ]
    header = {"file_format_type": "csv", "csv_use_header_line": True, "skip_header_rows": 1}
    assert added_columns(tmp_path / "a.csv", header, OLD, {}) == [("city", "string")]
    assert added_columns(tmp_path / "b.csv", {"file_format_type": "csv"}, OLD, {}) == []
    assert added_columns(tmp_path / "a.parquet", parquet, OLD, {"score": "x"}) == []
    named = {**parquet, "read_columns": ["id", "name"]}
    assert added_columns(tmp_path / "a.parquet", named, OLD, {}) == []


def _turn(reader):
    context = PollContext(PollLimits(max_records=1000), lambda: 0.0, 0.0)
    status = reader.poll(context)
    return status, context.records


def _reader(tmp_path, enabled: bool):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"id": 1, "name": "a", "age": 7}\n')
    option = "schema-changes.enabled = true, " if enabled else ""
    source = source_in(
        tmp_path / "in", f"file_format_type = json, {option}", "id = bigint, name = string"
    )
    reader = ManagedLocalFileReader(source, JobMode.STREAMING)
    reader.add_splits([{"splitId": "s1", "path": str(tmp_path / "in" / "a.json")}])
    return reader


def test_a_reader_asks_before_any_record_and_reads_with_the_new_schema(tmp_path):
    reader = _reader(tmp_path, enabled=True)
    status, records = _turn(reader)
    assert status == PollStatus.MORE_AVAILABLE and records == []
    assert reader.schema_request == [["id", "bigint"], ["name", "string"], ["age", "bigint"]]
    assert reader.offsets["s1"] == 0
    reader.schema_changed(reader.schema_request)
    reader.schema_request = None
    status, records = _turn(reader)
    assert records == [(1, "a", 7)] and reader.schema_request is None


def test_without_the_option_the_new_column_is_left_out(tmp_path):
    reader = _reader(tmp_path, enabled=False)
    _, records = _turn(reader)
    assert records == [(1, "a")] and reader.schema_request is None


def test_untrusted_column_names_are_bounded_and_checked(tmp_path):
    header = {"file_format_type": "csv", "csv_use_header_line": True}
    (tmp_path / "twice.csv").write_text("id,name,city,city\n1,a,x,y\n")
    (tmp_path / "wide.csv").write_text(",".join(f"c{i}" for i in range(101)) + "\n")
    (tmp_path / "blank.csv").write_text("id,,name\n")
    with pytest.raises(ValueError, match="city more than once"):
        added_columns(tmp_path / "twice.csv", header, OLD, {})
    with pytest.raises(ValueError, match="adds 101 columns to 2: a schema change adds at most 100"):
        added_columns(tmp_path / "wide.csv", header, OLD, {})
    with pytest.raises(ValueError, match="names are 1 to 63 bytes of printable text"):
        added_columns(tmp_path / "blank.csv", header, OLD, {})
    (tmp_path / "long.csv").write_text("id," + "x" * 64 + "\n")
    with pytest.raises(ValueError, match="names are 1 to 63 bytes"):
        added_columns(tmp_path / "long.csv", header, OLD, {})
    (tmp_path / "huge.csv").write_text(",".join(f"c{i}" for i in range(100_000)) + "\n")
    with pytest.raises(ValueError, match="names 100000 columns: at most 1000 are read"):
        added_columns(tmp_path / "huge.csv", header, OLD, {})
