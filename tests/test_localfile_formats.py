"""LocalFile reads and writes every format SeaTunnel's LocalFile has (text, csv, json,
parquet, orc, excel, binary) with SeaTunnel's options, through the engine's data plane."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal

import pyarrow.parquet as pq
import pytest
from openpyxl import load_workbook
from pyarrow import orc

from engine.connectors.batches import to_rows
from engine.jobconfig import ConfigError
from engine.jobs.planner import plan_job
from engine.member.dataplane import instantiate
from tests.localrun import run_batch

ROWS = 40
#: FakeSource's rows for this schema: id i, name "name-i", score i * 0.5, price i * 0.5 as a
#: decimal(10, 2), a timestamp i seconds after 2024-01-01.
SCHEMA = """schema { fields {
    id = bigint, name = string, score = double, price = "decimal(10, 2)", at = timestamp,
    tags = "array<string>", attrs = "map<string, int>" } }"""


def fake(extra: str = "") -> str:
    # row.num is per reader: ROWS rows for each of job()'s 2 readers, in 2 splits each
    return f"source {{ FakeSource {{ row.num = {ROWS}, split.num = 2, {SCHEMA} {extra} }} }}"


def job(sink: str, source: str | None = None) -> str:
    return f"env {{ job.mode = BATCH, parallelism = 2 }}\n{source or fake()}\nsink {{ {sink} }}"


def source_rows() -> list[dict]:
    """The rows FakeSource makes for SCHEMA, read through the planned source."""
    plan = plan_job(job("Blackhole {}"), None, {})
    source = instantiate(plan.pipelines[0].source.to_json())
    names = source.output_schema().names
    rows = []
    for split in source.create_splits("BATCH"):
        for batch, _ in source.read(split, 0, "BATCH", 1000):
            rows += [
                dict(zip(names, r, strict=True)) for r in to_rows(batch, source.output_schema())
            ]
    return rows


@pytest.mark.parametrize("fmt,codec", [("parquet", "snappy"), ("orc", "zlib"), ("parquet", "none")])
def test_parquet_and_orc_parts_read_back_exactly(tmp_path, fmt, codec):
    out = tmp_path / "out"
    result = run_batch(
        job(f'LocalFile {{ path = "{out}", file_format_type = {fmt}, compress_codec = {codec} }}')
    )
    assert result["written"] == 2 * ROWS
    parts = sorted(out.glob(f"part-*.{fmt}"))
    assert len(parts) == 2
    if fmt == "parquet":
        read = [r for p in parts for r in pq.read_table(p).to_pylist()]
    else:
        read = [r for p in parts for r in orc.read_table(p).to_pylist()]
    expected = source_rows()
    for row in read:
        row["at"] = row["at"].isoformat()
        row["attrs"] = dict(row["attrs"])
    for row in expected:
        row["at"] = row["at"].replace("+00:00", "")
    assert sorted(read, key=lambda r: r["id"]) == sorted(expected, key=lambda r: r["id"])
    assert isinstance(read[0]["price"], Decimal)


def test_a_parquet_directory_is_read_with_the_schema_it_declares(tmp_path):
    out = tmp_path / "out"
    run_batch(job(f'LocalFile {{ path = "{out}", file_format_type = parquet }}'))
    back = tmp_path / "back"
    result = run_batch(
        job(
            f'LocalFile {{ path = "{back}", file_format_type = json }}',
            source=f'source {{ LocalFile {{ path = "{out}", file_format_type = parquet,'
            " read_columns = [id, price] } }",
        )
    )
    assert result["received"] == 2 * ROWS
    lines = [ln for p in back.glob("*.jsonl") for ln in p.read_text().splitlines()]
    assert sorted(lines)[0] == '{"id": 0, "price": "0.00"}'
    assert len(lines) == 2 * ROWS


def test_text_with_delimiters_header_sink_columns_and_gzip_round_trips(tmp_path):
    out = tmp_path / "out"
    run_batch(
        job(
            f'LocalFile {{ path = "{out}", file_format_type = text, field_delimiter = "|",'
            ' row_delimiter = "\\n", sink_columns = [name, id], compress_codec = gzip }'
        )
    )
    parts = sorted(out.glob("part-*.txt"))
    lines = [ln for p in parts for ln in gzip.decompress(p.read_bytes()).decode().splitlines()]
    assert sorted(lines, key=lambda ln: int(ln.split("|")[1]))[:2] == ["name-0|0", "name-1|1"]
    back = tmp_path / "back"
    result = run_batch(
        job(
            f'LocalFile {{ path = "{back}", file_format_type = csv }}',
            source=f'source {{ LocalFile {{ path = "{out}", file_format_type = text,'
            ' field_delimiter = "|", compress_codec = gzip,'
            " schema { fields { name = string, id = bigint } } } }",
        )
    )
    assert result["received"] == 2 * ROWS


def test_text_defaults_to_seatunnel_s_control_a_delimiter(tmp_path):
    out = tmp_path / "out"
    run_batch(job(f'LocalFile {{ path = "{out}", file_format = text, sink_columns = [id, name] }}'))
    text = "".join(p.read_text() for p in out.glob("part-*.txt"))
    assert "0\x01name-0\n" in text


def test_partitions_custom_file_names_and_excel(tmp_path):
    out = tmp_path / "out"
    source = fake().replace("row.num", "string.length = 6, row.num")
    run_batch(
        job(
            f'LocalFile {{ path = "{out}", file_format_type = excel, have_partition = true,'
            ' partition_by = [score], partition_dir_expression = "${k0}=${v0}",'
            " is_partition_field_write_in_file = false, sink_columns = [id, score],"
            ' custom_filename = true, file_name_expression = "${transactionId}_${now}",'
            ' filename_time_format = "yyyyMMdd", enable_header_write = true,'
            ' sheet_name = "rows" }',
            source=source,
        )
    )
    directories = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert directories[:3] == ["score=0.0", "score=0.5", "score=1.0"]
    assert len(directories) == 2 * ROWS
    (part,) = (out / "score=1.0").glob("*.xlsx")
    assert part.name.startswith("part-1-1-") and part.name.count("_") == 1
    sheet = load_workbook(part)["rows"]
    assert [list(r) for r in sheet.iter_rows(values_only=True)] == [["id"], [2]]


def test_binary_files_are_copied_byte_for_byte(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    payload = bytes(range(256)) * 9
    (src / "a.bin").write_bytes(payload)
    (src / "b.dat").write_bytes(b"small")
    out = tmp_path / "out"
    result = run_batch(
        job(
            f'LocalFile {{ path = "{out}", file_format_type = binary }}',
            source=f'source {{ LocalFile {{ path = "{src}", file_format_type = binary,'
            " binary_chunk_size = 1000 } }",
        )
    )
    assert result["received"] == 4  # 3 chunks and 1
    assert (out / "a.bin").read_bytes() == payload
    assert (out / "b.dat").read_bytes() == b"small"


def test_csv_source_options(tmp_path):
    src = tmp_path / "src"
    (src / "day=2024-01-02").mkdir(parents=True)
    (src / "day=2024-01-02" / "a.csv").write_text("name;id\n'x;y';1\nNULL;2\n")
    (src / "skip.txt").write_text("not,this\n")
    out = tmp_path / "out"
    run_batch(
        job(
            f'LocalFile {{ path = "{out}", file_format_type = json }}',
            source=f'source {{ LocalFile {{ path = "{src}", file_format_type = csv,'
            ' delimiter = ";", quote_char = "\'", csv_use_header_line = true,'
            ' null_format = "NULL", file_filter_pattern = "\\\\.csv$",'
            " schema { fields { id = int, name = string, day = date } } } }",
        )
    )
    lines = sorted(ln for p in out.glob("*.jsonl") for ln in p.read_text().splitlines())
    assert lines == [
        '{"id": 1, "name": "x;y", "day": "2024-01-02"}',
        '{"id": 2, "name": null, "day": "2024-01-02"}',
    ]


@pytest.mark.parametrize(
    "options,path,message",
    [
        ("file_format_type = orc, compress_codec = lzo", "compress_codec", "no LZO codec"),
        ("file_format_type = xml", "file_format_type", "must be one of"),
        ("sink_columns = [nope]", "sink_columns", "not in the sink's input: nope"),
        ("have_partition = true", "partition_by", "needs the fields"),
    ],
)
def test_bad_sink_options_name_the_option(tmp_path, options, path, message):
    with pytest.raises(ConfigError) as caught:
        run_batch(job(f'LocalFile {{ path = "{tmp_path}", {options} }}'))
    errors = caught.value.errors
    assert any(e["path"].endswith(path) and message in e["message"] for e in errors), errors


def test_options_without_effect_are_accepted_with_a_warning(tmp_path):
    result = run_batch(
        job(
            f'LocalFile {{ path = "{tmp_path}", is_enable_transaction = true,'
            ' tmp_path = "/tmp/x", date_format = "yyyy-MM-dd", batch_size = 10 }'
        )
    )
    warned = {w["path"].rsplit(".", 1)[1] for w in result["warnings"]}
    assert {"is_enable_transaction", "tmp_path", "date_format", "batch_size"} <= warned


def test_a_partition_value_never_leads_out_of_the_sink_s_path(tmp_path):
    out = tmp_path / "out"
    source = """source { FakeSource { schema { fields { id = int, name = string } }, rows = [
      { fields = [1, "../up"] }, { fields = [2, ".."] }, { fields = [3, "a/b"] },
      { fields = [4, null] } ] } }"""
    run_batch(
        job(
            f'LocalFile {{ path = "{out}", file_format_type = json, have_partition = true,'
            ' partition_by = [name], partition_dir_expression = "${v0}" }',
            source=source,
        )
    )
    directories = sorted(p.name for p in out.iterdir() if p.name != ".keel-tmp")
    assert directories == ["%2E.", "%2E.%2Fup", "__HIVE_DEFAULT_PARTITION__", "a%2Fb"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_link_out_of_the_roots_is_neither_read_nor_written_through(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.csv").write_text("1\n")
    (src / "secret.csv").symlink_to("/etc/hostname")
    with pytest.raises(ConfigError) as caught:
        run_batch(
            job(
                f'LocalFile {{ path = "{tmp_path}/out" }}',
                source=f'source {{ LocalFile {{ path = "{src}",'
                " schema { fields { a = string } } } }",
            )
        )
    assert "outside the file roots" in str(caught.value)
    out = tmp_path / "out"
    out.mkdir()
    (out / ".keel-tmp").symlink_to("/etc")
    with pytest.raises(Exception, match="outside the file roots"):
        run_batch(job(f'LocalFile {{ path = "{out}" }}'))


def test_binary_keeps_each_file_s_path_under_the_source(tmp_path):
    src = tmp_path / "src"
    for name in ("a", "b"):
        (src / name).mkdir(parents=True)
        (src / name / "x.bin").write_bytes(name.encode() * 10)
    out = tmp_path / "out"
    run_batch(
        job(
            f'LocalFile {{ path = "{out}", file_format_type = binary }}',
            source=f'source {{ LocalFile {{ path = "{src}", file_format_type = binary }} }}',
        )
    )
    assert (out / "a" / "x.bin").read_bytes() == b"a" * 10
    assert (out / "b" / "x.bin").read_bytes() == b"b" * 10


def test_two_sinks_on_one_directory_write_their_own_parts(tmp_path):
    sink = f'LocalFile {{ path = "{tmp_path}", file_format_type = json }}'
    result = run_batch(job(f"{sink}\n{sink}"))
    assert result["written"] == 4 * ROWS
    lines = [ln for p in tmp_path.glob("part-*.jsonl") for ln in p.read_text().splitlines()]
    assert len(lines) == 4 * ROWS


@pytest.mark.parametrize(
    "options,path",
    [
        ('custom_filename = true, file_name_expression = "../x"', "file_name_expression"),
        (
            'have_partition = true, partition_by = [id], partition_dir_expression = "../${v0}"',
            "partition_dir_expression",
        ),
    ],
)
def test_names_that_would_leave_the_path_are_400s(tmp_path, options, path):
    with pytest.raises(ConfigError) as caught:
        run_batch(job(f'LocalFile {{ path = "{tmp_path}", {options} }}'))
    assert any(e["path"].endswith(path) for e in caught.value.errors), caught.value.errors


def test_wide_decimals_deep_types_and_bad_nested_names():
    from engine.connectors.schema import convert, normalise_kind

    wide = convert("decimal(38, 10)", "1234567890123456789.0123456789")
    assert str(wide) == "1234567890123456789.0123456789"
    with pytest.raises(ValueError, match="nest at most"):
        normalise_kind("array<" * 3000 + "int" + ">" * 3000)
    with pytest.raises(ValueError, match="no , : < >"):
        normalise_kind({"a,b": "int"})


def test_partition_values_round_trip_through_their_directory_names(tmp_path):
    out = tmp_path / "out"
    names = ["a/b", "50%", ".hidden", None]
    rows = ", ".join(
        f"{{ fields = [{i}, {'null' if n is None else repr(n).replace(chr(39), chr(34))}] }}"
        for i, n in enumerate(names)
    )
    run_batch(
        job(
            f'LocalFile {{ path = "{out}", file_format_type = json, have_partition = true,'
            " partition_by = [name] }",
            # one reader: as in SeaTunnel, each reader emits the listed rows
            source=f"source {{ FakeSource {{ schema {{ fields {{ id = int, name = string }} }},"
            f" rows = [{rows}], parallelism = 1 }} }}",
        )
    )
    back = tmp_path / "back"
    run_batch(
        job(
            f'LocalFile {{ path = "{back}", file_format_type = json }}',
            source=f'source {{ LocalFile {{ path = "{out}", file_format_type = json,'
            " schema { fields { id = int, name = string } } } }",
        )
    )
    read = [json.loads(ln) for p in back.glob("*.jsonl") for ln in p.read_text().splitlines()]
    assert sorted((r["id"], r["name"]) for r in read) == [(i, n) for i, n in enumerate(names)]
