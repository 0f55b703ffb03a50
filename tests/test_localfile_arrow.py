"""LocalFile reads and writes Arrow batches with pyarrow's readers and writers: what they read
equals what the row path reads, for every type of the type table and every format, from any
offset, and what they write is byte for byte what the rows would write. A converted path never
builds a Python row; what pyarrow cannot do exactly goes through rows, with the same result."""

from __future__ import annotations

import datetime
import gzip
import json
import math
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyarrow import orc

from engine.connectors import batches
from engine.connectors.arrowrows import arrow_schema
from engine.connectors.base import SourcePlugin
from engine.connectors.batches import from_rows, to_rows
from engine.connectors.localfile import LocalFileSource
from engine.connectors.localfile_sink import LocalFileWriter
from engine.connectors.schema import Schema, jsonable
from engine.jobs.planner import plan_job
from engine.member.dataplane import instantiate
from tests.test_arrow_batches import TYPES

FIRST = (-8, 300, 70000, 2**40, 1.5, -2.25, Decimal("12345678.1234"), 0.125, 'a, "b"\tc', True)
TIMES = ("2026-12-04", "12:34:56.789000", "2026-12-04T01:02:03.456789")
SECOND = (0, 0, 0, 0, 0.1, 1e-05, Decimal("0E-4"), 1e16, "", False, b"")
ROWS = [
    (*FIRST, b"bytes", *TIMES, None, [1, None, 3], {"x": 1.5, "y": None}, (7, "seven")),
    (*SECOND, "0999-01-01", "00:00:00", "2024-01-01T00:00:00", None, [], {}, (None, None)),
    tuple(None for _ in TYPES.fields),
]
NESTED = ("list", "dict", "nested")


def types(*leave_out: str) -> Schema:
    return Schema(tuple((n, k) for n, k in TYPES.fields if n not in leave_out))


def rows(schema: Schema) -> list[tuple]:
    picks = [TYPES.index(n) for n in schema.names]
    return [tuple(r[i] for i in picks) for r in ROWS]


def source(path: Path, fmt: str, schema: Schema | None, extra: str = "") -> LocalFileSource:
    fields = f"schema = {json.dumps({'fields': dict(schema.fields)})}," if schema else ""
    plan = plan_job(
        f'source {{ LocalFile {{ path = "{path}", file_format_type = {fmt}, {fields} {extra} }} }}'
        "\nsink { Blackhole {} }"
    )
    return instantiate(plan.pipelines[0].source.to_json())


def no_rows(*args, **kwargs):
    raise AssertionError("the batch path built Python rows")


def spy(monkeypatch, owner, name: str) -> list:
    """The calls of ``owner.name``, which still runs."""
    calls, original = [], getattr(owner, name)

    def recorded(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, recorded)
    return calls


def batch_path(src: LocalFileSource, monkeypatch, offset: int = 0, size: int = 4) -> list:
    """(batch, next offset) from every split, by ``read``, which must not build rows."""
    with monkeypatch.context() as patched:
        patched.setattr(LocalFileSource, "read_rows", no_rows)
        return [step for s in src.create_splits("BATCH") for step in src.read(s, offset, "", size)]


def row_path(src: LocalFileSource, offset: int = 0) -> list:
    """(batch, next offset) as the base class makes them from ``read_rows``."""
    splits = src.create_splits("BATCH")
    return [step for s in splits for step in SourcePlugin.read(src, s, offset, "", 4)]


def table(steps: list, src: LocalFileSource) -> pa.Table:
    schema = arrow_schema(src.output_schema())
    return pa.Table.from_batches([b for b, _ in steps], schema).combine_chunks()


def assert_same_reads(src: LocalFileSource, monkeypatch, records: int) -> pa.Table:
    native, by_rows = batch_path(src, monkeypatch), row_path(src)
    assert table(native, src).equals(table(by_rows, src)), (native, by_rows)
    assert native[-1][1] == by_rows[-1][1] == records  # offsets count records
    assert max(b.num_rows for b, _ in native) <= 4  # at most batch_size rows
    return table(native, src)


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_parquet_and_orc_columns_are_read_as_the_rows_read_them(tmp_path, fmt, monkeypatch):
    schema = types("clock", "nothing") if fmt == "orc" else TYPES  # ORC has no time, no null
    data = pa.Table.from_batches([from_rows(rows(schema), schema)])
    (pq.write_table if fmt == "parquet" else orc.write_table)(data, tmp_path / f"a.{fmt}")
    assert_same_reads(source(tmp_path, fmt, schema), monkeypatch, len(ROWS))
    assert_same_reads(source(tmp_path, fmt, None), monkeypatch, len(ROWS))  # its own schema
    projected = source(tmp_path, fmt, None, "read_columns = [nested, b]")
    assert assert_same_reads(projected, monkeypatch, len(ROWS)).column_names == ["nested", "b"]


def test_file_types_are_cast_to_the_schema_s_as_convert_does(tmp_path, monkeypatch):
    """Narrower integers, other timestamp units and zones, dictionary and large strings, empty
    strings (null, as in every format), integers as booleans and decimals, a missing column."""
    pq.write_table(
        pa.table(
            {
                "id": pa.array([1, 2, None], pa.int32()),
                "at": pa.array([0, 1_700_000_000_000, None], pa.timestamp("ms", "Europe/Paris")),
                "name": pa.array(["a", "", "NULL"]).dictionary_encode(),
                "text": pa.array(["x", None, ""], pa.large_string()),
                "flag": pa.array([1, 0, 2], pa.int8()),
                "price": pa.array([1, 2, 3], pa.int64()),
                "whole": pa.array([1.0, -2.0, None]),
            }
        ),
        tmp_path / "a.parquet",
    )
    schema = Schema(
        (
            ("id", "bigint"),
            ("at", "timestamp"),
            ("name", "string"),
            ("text", "string"),
            ("flag", "boolean"),
            ("price", "decimal(10, 2)"),
            ("whole", "int"),
            ("missing", "int"),
        )
    )
    read = assert_same_reads(
        source(tmp_path, "parquet", schema, 'null_format = "NULL"'), monkeypatch, 3
    )
    assert read.column("name").to_pylist() == ["a", None, None]
    assert read.column("flag").to_pylist() == [True, False, False]


def text_fields(schema: Schema) -> list[list[str]]:
    return [["" if v is None else str(v) for v in r] for r in rows(schema)]


@pytest.mark.parametrize("fmt", ["csv", "text"])
def test_csv_and_text_fields_are_read_as_the_rows_read_them(tmp_path, fmt, monkeypatch):
    schema = types(*NESTED)  # JSON text in a field goes through rows (below)
    delimiter = "," if fmt == "csv" else "\x01"
    fields = text_fields(schema)
    if fmt == "csv":
        fields = [['"' + v.replace('"', '""') + '"' if '"' in v else v for v in r] for r in fields]
    header = delimiter.join(schema.names)  # as wide as the records: pyarrow reads the first
    lines = [header, "", *(delimiter.join(r) for r in fields), "", ""]
    (tmp_path / "a.txt").write_text("\n".join(lines))
    src = source(tmp_path, fmt, schema, "skip_header_rows = 1")
    read = assert_same_reads(src, monkeypatch, len(ROWS))
    assert read.column("dec").to_pylist()[0] == Decimal("12345678.1234")
    assert read.column("str").to_pylist()[1] is None  # "" is null
    assert read.column("clock").to_pylist()[0] == datetime.time(12, 34, 56, 789000)


def test_json_lines_are_read_as_the_rows_read_them(tmp_path, monkeypatch):
    schema = types("dict")  # a map goes through rows (below)
    lines = [
        json.dumps({n: jsonable(k, v) for (n, k), v in zip(schema.fields, r, strict=True)})
        for r in rows(schema)
    ]
    lines[0] = lines[0].replace("{", '{"unknown": [1, {"x": "y"}], ', 1)
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n   \n")
    read = assert_same_reads(source(tmp_path, "json", schema), monkeypatch, len(ROWS))
    assert read.column("nested").to_pylist()[0] == {"a": 7, "b": "seven"}


def test_a_replay_from_any_offset_is_exact(tmp_path, monkeypatch):
    """Offsets count records (blank lines are none), as the row path counts them."""
    (tmp_path / "a.csv").write_text("".join(f"{i},name-{i}\n\n" for i in range(10)))
    src = source(tmp_path, "csv", Schema((("id", "int"), ("name", "string"))))
    assert [o for _, o in batch_path(src, monkeypatch, size=3)] == [3, 6, 9, 10]
    for offset in (0, 3, 7, 10):
        native = table(batch_path(src, monkeypatch, offset), src)
        assert native.equals(table(row_path(src, offset), src))
    assert table(batch_path(src, monkeypatch, 7), src).column("id").to_pylist() == [7, 8, 9]


def test_a_value_pyarrow_reads_otherwise_sends_the_rest_of_the_file_through_rows(
    tmp_path, monkeypatch
):
    """Python's int() takes " 7"; pyarrow's parser does not: from that batch on, rows."""
    (tmp_path / "a.csv").write_text("".join(f"{i}\n" for i in range(7)) + " 7\n8\n")
    src = source(tmp_path, "csv", Schema((("id", "int"),)))
    calls = spy(monkeypatch, LocalFileSource, "read_rows")
    split = src.create_splits("BATCH")[0]
    steps = list(src.read(split, 0, "", 3))
    assert [o for _, o in steps] == [3, 6, 9]
    assert [c[2] for c in calls] == [6]  # the rows read from record 6 only
    assert table(steps, src).column("id").to_pylist() == list(range(9))


def test_header_lines_partitions_gzip_and_encodings(tmp_path, monkeypatch):
    day = tmp_path / "day=2024-01-02" / "region=%2Fnorth"
    day.mkdir(parents=True)
    text = "junk;junk\nname;id\n'x;y';1\nNULL;2\n'\u00e9';3\n"
    (day / "a.csv.gz").write_bytes(gzip.compress(text.encode("latin-1")))
    schema = Schema((("id", "int"), ("name", "string"), ("day", "date"), ("region", "string")))
    options = (
        'skip_header_rows = 1, csv_use_header_line = true, delimiter = ";", quote_char = "\'",'
        ' null_format = "NULL", encoding = "ISO-8859-1", read_columns = [region, name, id, day],'
        ' escape_char = "\\\\"'  # none in the file: read as Python reads it
    )
    read = assert_same_reads(source(tmp_path, "csv", schema, options), monkeypatch, 3)
    assert read.to_pylist()[0] == {
        "region": "/north",
        "name": "x;y",
        "id": 1,
        "day": datetime.date(2024, 1, 2),
    }


def test_partition_fields_fill_the_records_that_lack_them(tmp_path, monkeypatch):
    (tmp_path / "k=v1").mkdir()
    (tmp_path / "k=v1" / "a.jsonl").write_text('{"id": 1}\n{"id": 2, "other": "k"}\n')
    (tmp_path / "k=v1" / "b.txt").write_text("3\n")
    schema = Schema((("id", "int"), ("k", "string")))
    read = assert_same_reads(
        source(tmp_path, "json", schema, 'file_filter_pattern = "a"'), monkeypatch, 2
    )
    assert read.column("k").to_pylist() == ["v1", "v1"]
    assert_same_reads(source(tmp_path, "text", schema, 'file_filter_pattern = "b"'), monkeypatch, 1)


@pytest.mark.parametrize(
    "fmt,content,fields,extra",
    [
        # a JSON key its directory also gives: the record's value (null here) wins
        ("json", '{"id": 1}\n{"id": 2, "k": null}\n', {"id": "int", "k": "string"}, ""),
        ("json", '{"id": 1}\n{"\\u006b": "escaped"}\n', {"id": "int", "k": "string"}, ""),
        ("json", '{"id": "7", "m": {"a": 1}}\n', {"id": "int", "m": "map<string, int>"}, ""),
        ("json", '[1, "positional"]\n{"id": 2}\n', {"id": "int", "k": "string"}, ""),
        ("json", '{"id": 1, "id": 2}\n', {"id": "int"}, ""),
        ("json", '\ufeff{"id": 1}\n', {"id": "int"}, ""),
        ("csv", 'a\\,b,"[1, 2]"\n', {"s": "string", "l": "array<int>"}, 'escape_char = "\\\\"'),
        ("csv", "0x1F, 12 ,1_000\n", {"a": "string", "b": "int", "c": "int"}, ""),
        ("csv", "2024-01-01T10:00:00Z,yes\n", {"a": "timestamp", "b": "boolean"}, ""),
        ("csv", "1.005,1\n", {"a": "decimal(10, 2)", "b": "string"}, ""),
        ("csv", "title\na,b\n", {"a": "string", "b": "string"}, "skip_header_rows = 1"),
        ("text", "a\rb|c\n", {"a": "string", "b": "string"}, 'delimiter = "|"'),
        ("text", "a::b\n", {"a": "string", "b": "string"}, 'delimiter = "::"'),
        ("text", "1,2\n3\n", {"a": "string", "b": "string"}, 'delimiter = ","'),
    ],
)
def test_what_pyarrow_cannot_read_exactly_goes_through_rows(
    tmp_path, monkeypatch, fmt, content, fields, extra
):
    directory = tmp_path / "k=v"
    directory.mkdir()
    (directory / "a").write_text(content)
    src = source(tmp_path, fmt, Schema(tuple(fields.items())), extra)
    split = src.create_splits("BATCH")[0]
    try:
        expected = table(row_path(src), src)
    except ValueError as exc:  # what the row path refuses, the batch path refuses alike
        with pytest.raises(ValueError) as caught:
            list(src.read(split, 0, "", 4))
        assert str(caught.value) == str(exc)
        return
    calls = spy(monkeypatch, LocalFileSource, "read_rows")
    assert table(list(src.read(split, 0, "", 4)), src).equals(expected)
    assert calls  # it went through rows


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(["a", "1", ",", '"', "\n", "\r", " ", "\r\n", '""']), max_size=16))
def test_csv_quotes_and_line_ends_are_read_as_python_s_csv_module_reads_them(tmp_path, pieces):
    path = tmp_path / "fuzz.csv"
    path.write_text("".join(pieces), newline="")
    src = source(path, "csv", Schema((("a", "string"), ("b", "string"))))
    split = src.create_splits("BATCH")[0]
    try:
        expected = table(row_path(src), src)
    except ValueError:
        with pytest.raises(ValueError):
            list(src.read(split, 0, "", 4))
        return
    assert table(list(src.read(split, 0, "", 4)), src).equals(expected)


# -- the sink --------------------------------------------------------------------------------------


def writer(path: Path, fmt: str, schema: Schema, extra: str = "") -> LocalFileWriter:
    plan = plan_job(
        f"source {{ FakeSource {{ schema = {json.dumps({'fields': dict(schema.fields)})} }} }}\n"
        f'sink {{ LocalFile {{ path = "{path}", file_format_type = {fmt}, {extra} }} }}'
    )
    sink = instantiate(plan.pipelines[0].sinks[0].to_json())
    return sink.writer(schema, {"jobId": 1, "pipelineId": 1, "readerIndex": 0, "attempt": 1})


def published(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and ".keel-tmp" not in p.parts
    }


def assert_same_writes(tmp_path, monkeypatch, fmt, schema, data, extra="", native=True) -> dict:
    """The parts two batches write equal those their rows write, byte for byte; ``native``: no
    row is built on the way, else some are."""
    batch = from_rows(data, schema)
    by_rows = writer(tmp_path / "rows", fmt, schema, extra)
    for part in (batch.slice(0, 1), batch.slice(1)):
        by_rows.write_rows(to_rows(part, schema))
    by_rows.close()
    with monkeypatch.context() as patched:
        calls = spy(patched, batches, "to_rows")
        if native:
            patched.setattr(LocalFileWriter, "write_rows", no_rows)
        by_batch = writer(tmp_path / "batches", fmt, schema, extra)
        by_batch.write(batch.slice(0, 1))
        by_batch.write(batch.slice(1))
        by_batch.close()
    assert bool(calls) != native
    expected = published(tmp_path / "rows")
    assert published(tmp_path / "batches") == expected
    return expected


@pytest.mark.parametrize(
    "fmt,leave_out",
    [
        ("parquet", ()),
        ("orc", ("clock", "nothing")),
        ("json", ()),
        ("csv", ("raw", *NESTED)),  # csv writes bytes and nested values as Python's repr
        ("text", NESTED),  # text writes them as json.dumps(default=str)
    ],
)
def test_batches_are_written_as_their_rows_would_be(tmp_path, monkeypatch, fmt, leave_out):
    schema = types(*leave_out)
    data = rows(schema)
    if fmt == "json":  # json.dumps writes a tab as it is, other controls as \u escapes
        data = [tuple(v.replace("\t", "\n") if isinstance(v, str) else v for v in r) for r in data]
    parts = assert_same_writes(tmp_path, monkeypatch, fmt, schema, data, "header = true")
    assert len(parts) == 1
    if fmt in ("parquet", "orc"):
        (part,) = (tmp_path / "batches").glob(f"*.{fmt}")
        read = (pq.read_table if fmt == "parquet" else orc.read_table)(part)
        assert read.to_pylist() == from_rows(data, schema).to_pylist()


FLOATS = [0.1, 1e-05, 1e16, 123456789012345.6, -0.0, 5e-324, 2.5, 1e22, math.inf, -math.inf]
FLOATS += [math.nan, 1 / 3, 1e15 + 0.5, 1.7e12, 12345678901.5, 4.35e-05, 1e-07, None]


@pytest.mark.parametrize("fmt", ["csv", "json", "text"])
def test_numbers_and_quoting_are_written_as_python_writes_them(tmp_path, monkeypatch, fmt):
    schema = Schema((("x", "double"), ("y", "float"), ("s", "string"), ("d", "decimal(20, 9)")))
    words = ["a,b", 'say "hi"', "line\nbreak", "cr\ronly", "", None, "x|y"]
    data = [
        (x, x, words[i % len(words)], Decimal(i) / 8 if i % 3 else Decimal("0.000000001"))
        for i, x in enumerate(FLOATS)
    ]
    assert_same_writes(tmp_path, monkeypatch, fmt, schema, data)
    assert_same_writes(tmp_path / "pipe", monkeypatch, fmt, schema, data, 'field_delimiter = "|"')


def test_a_lone_empty_csv_field_is_quoted_as_python_s_csv_module_quotes_it(tmp_path, monkeypatch):
    parts = assert_same_writes(
        tmp_path, monkeypatch, "csv", Schema((("s", "string"),)), [("",), (None,), ("a",)]
    )
    assert list(parts.values()) == [b'""\n""\na\n']


def test_partitions_of_a_batch_go_to_the_directories_rows_go_to(tmp_path, monkeypatch):
    schema = Schema((("id", "int"), ("name", "string"), ("score", "double"), ("at", "timestamp")))
    data = [
        (i, ["a/b", "50%", ".hidden", None][i % 4], i / 2, f"2024-01-0{1 + i % 2}T00:00:00")
        for i in range(12)
    ]
    options = "have_partition = true, partition_by = [name, score, at], sink_columns = [id]"
    parts = assert_same_writes(tmp_path, monkeypatch, "json", schema, data, options)
    assert len(parts) == 12
    assert "name=%2Ehidden/score=1.0/at=2024-01-01T00:00:00/part-1-1-0.jsonl" in parts
    merged = f'{options}, partition_dir_expression = "${{k0}}=${{v0}}"'  # rows of 3 keys a file
    assert len(assert_same_writes(tmp_path / "e", monkeypatch, "csv", schema, data, merged)) == 4


@pytest.mark.parametrize(
    "fmt,schema,data",
    [
        ("json", Schema((("s", "string"),)), [("naïve ☃",), ("ctrl\x01",)]),  # \u escapes
        ("csv", Schema((("b", "bytes"),)), [(b"\x00\xff",), (b"a",)]),  # Python's repr of bytes
        ("text", Schema((("l", "array<int>"),)), [([1, 2],), ([],)]),  # json.dumps(default=str)
        ("json", Schema((("b", "bytes"),)), [(b"\xff",), (b"a",)]),  # decoded with replacement
        ("excel", Schema((("i", "int"),)), [(1,), (2,)]),
    ],
)
def test_what_pyarrow_cannot_write_exactly_goes_through_rows(
    tmp_path, monkeypatch, fmt, schema, data
):
    assert_same_writes(tmp_path, monkeypatch, fmt, schema, data, native=False)


def test_a_map_repeating_a_key_is_written_once_as_the_rows_write_it(tmp_path):
    schema = Schema((("m", "map<string, int>"),))
    batch = pa.RecordBatch.from_arrays(
        [pa.array([[("a", 1), ("a", 2)]], pa.map_(pa.string(), pa.int32()))], names=["m"]
    )
    for fmt in ("parquet", "json"):
        sink = writer(tmp_path / fmt, fmt, schema)
        sink.write(batch)
        sink.close()
    assert pq.read_table(tmp_path / "parquet").column("m").to_pylist() == [[("a", 2)]]
    assert (tmp_path / "json" / "part-1-1-0.jsonl").read_text() == '{"m": {"a": 2}}\n'
