"""The file formats of LocalFile: how a file's records are read and how a part is written.

Every format reads to records (lists by position, or dicts by name) that the source converts to
the schema, and writes through a ``PartFile`` that the sink publishes with a rename once closed.
Parquet and ORC go through pyarrow, Excel through openpyxl; text, csv and json are written here
(a few lines each), optionally gzip-compressed. ``arrow_records`` reads text, csv, json lines,
Parquet and ORC as Arrow batches instead, record for record as ``records`` does.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import os
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.connectors.schema import Schema, jsonable, kind_args, row_fields

FORMATS = ("text", "csv", "json", "parquet", "orc", "excel", "binary")
#: The file name suffix of each format's parts (as SeaTunnel's, but JSON lines are ``jsonl``).
SUFFIX = {
    "text": "txt",
    "csv": "csv",
    "json": "jsonl",
    "parquet": "parquet",
    "orc": "orc",
    "excel": "xlsx",
    "binary": "bin",
}
#: compress_codec values per format ("none" everywhere); SeaTunnel's lzo has no codec here.
CODECS = {
    "text": ("none", "gzip"),
    "csv": ("none", "gzip"),
    "json": ("none", "gzip"),
    "parquet": ("none", "snappy", "gzip", "lz4", "brotli", "zstd"),
    "orc": ("none", "snappy", "zlib", "lz4", "zstd"),
    "excel": ("none",),
    "binary": ("none",),
}
#: The fixed schema of a binary source: each file in chunks.
BINARY_SCHEMA = Schema((("data", "bytes"), ("relativePath", "string"), ("partIndex", "bigint")))


def text_delimiter(value: str) -> str:
    """SeaTunnel configs write control characters escaped (``"\\001"``, ``"\\t"``)."""
    if len(value) == 4 and value.startswith("\\") and value[1:].isdigit():
        return chr(int(value[1:], 8))
    return {"\\t": "\t", "\\n": "\n", "\\r\\n": "\r\n", "\\001": "\x01"}.get(value, value)


# -- reading -------------------------------------------------------------------------------------


def _open_text(path: Path, config: dict) -> IO[str]:
    encoding = config.get("encoding") or "utf-8"
    if config.get("compress_codec") == "gzip" or path.suffix == ".gz":
        return gzip.open(path, "rt", newline="", encoding=encoding)
    return open(path, newline="", encoding=encoding)


def records(path: Path, config: dict, names: list[str], relative: str = ""):
    """The records of one file, in order: lists (by position) or dicts (by name)."""
    fmt = config["file_format_type"]
    if fmt in ("parquet", "orc"):
        yield from (r for b in _columnar(path, fmt, names) for r in b.to_pylist())
    elif fmt == "excel":
        yield from _excel_records(path, config)
    elif fmt == "binary":
        yield from _binary_records(path, config, relative or path.name)
    else:
        with _open_text(path, config) as fh:
            if fmt == "csv":
                reader = csv.reader(
                    fh,
                    delimiter=text_delimiter(config["field_delimiter"]),
                    quotechar=config.get("quote_char") or '"',
                    escapechar=config.get("escape_char") or None,
                )
                yield from (r for r in reader if r)
            elif fmt == "json":
                yield from (json.loads(line) for line in fh if line.strip())
            else:
                field = text_delimiter(config["field_delimiter"])
                row = text_delimiter(config.get("row_delimiter") or "\n")
                for line in fh.read().split(row):
                    if line.strip("\r\n"):
                        yield line.rstrip("\r").split(field)


def arrow_schema_of(path: Path, fmt: str) -> Schema:
    """The schema a Parquet or ORC file declares, in Keel's types."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
    else:
        from pyarrow import orc

        schema = orc.ORCFile(path).schema
    from engine.connectors.arrowrows import schema_of

    return schema_of(schema)


# -- reading as Arrow batches --------------------------------------------------------------------


class Unsupported(Exception):
    """What pyarrow cannot read or write exactly as the row path does: that goes through rows."""


#: Failures of a batch path that the row path answers instead (with its own error, if any).
ARROW_FAILURES = (Unsupported, pa.ArrowException, ValueError, TypeError, LookupError, OSError)
#: What Python's ``str.strip()`` strips.
PY_SPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace())


def family(kind: str) -> str:
    """A kind's base; integers are "integer", floats (and a decimal without precision) "number"."""
    base, args = kind_args(kind)
    if base in ("tinyint", "smallint", "int", "bigint"):
        return "integer"
    return "number" if base in ("float", "double") or (base == "decimal" and not args) else base


def arrow_records(
    path: Path, config: dict, fields: list[tuple[str, str]], from_path: set[str]
) -> Iterator[pa.RecordBatch]:
    """The file's records as batches, a row a record as ``records`` counts them: Parquet and ORC
    columns as the file types them, text and csv fields as strings by position (``f0``...),
    json lines' ``fields`` in JSON types (Unsupported where a line names one of ``from_path``)."""
    fmt = config["file_format_type"]
    if fmt in ("parquet", "orc"):
        return _columnar(path, fmt, [n for n, _ in fields])
    if fmt in ("text", "csv"):
        return _delimited(path, config, fmt)
    if fmt != "json":
        raise Unsupported(f"{fmt} files are read as rows")
    kind = pa.struct([(n, _json_type(k)) for n, k in fields if k != "null"])
    return _json_lines(path, config, kind, from_path)


def _columnar(path: Path, fmt: str, names: list[str]) -> Iterator[pa.RecordBatch]:
    """Parquet or ORC batches of the columns of ``names`` the file has (all if it has none)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        columns = [n for n in names if n in parquet.schema_arrow.names] or None
        return parquet.iter_batches(columns=columns)
    from pyarrow import orc

    file = orc.ORCFile(path)
    columns = [n for n in names if n in file.schema.names] or None
    return (file.read_stripe(i, columns=columns) for i in range(file.nstripes))


def _text_source(path: Path, config: dict, whole: bool):
    """A function opening the file's text afresh, and its encoding for pyarrow: the bytes read
    whole as UTF-8 (``whole``: the text format splits at ``\\n`` only), else the stream."""
    name = codecs.lookup(config.get("encoding") or "utf-8").name
    encoding = "utf8" if name == "utf-8" else name
    gz = config.get("compress_codec") == "gzip" or path.suffix == ".gz"
    opener = lambda: pa.input_stream(str(path), compression="gzip" if gz else None)  # noqa: E731
    with opener() as stream:
        data = stream.read() if whole else stream.read(3)
    if encoding == "utf8" and data.startswith(codecs.BOM_UTF8):
        raise Unsupported("a byte order mark, which Python keeps")
    if not whole:
        return opener, encoding
    data = data if encoding == "utf8" else data.decode(encoding).encode()
    if data.count(b"\r") != data.count(b"\r\n"):
        raise Unsupported("a carriage return inside a line")
    return lambda: pa.BufferReader(data), "utf8"


def _delimited(path: Path, config: dict, fmt: str) -> Iterator[pa.RecordBatch]:
    """Fields of text, csv (quoted, as Python's csv module reads them while no escape character
    comes) or json lines (a line a field) as strings, all rows as wide as the first."""
    import pyarrow.csv as pcsv

    delimiter = "\x1e" if fmt == "json" else text_delimiter(config["field_delimiter"])
    quote = fmt == "csv" and (config.get("quote_char") or '"')
    escape = fmt == "csv" and config.get("escape_char")  # left in a field: pyarrow kept it
    lines = fmt != "text" or text_delimiter(config.get("row_delimiter") or "\n") == "\n"
    if len(delimiter) != 1 or not lines or escape in (delimiter, quote or None):
        raise Unsupported("a delimiter, or an escape character, that pyarrow reads otherwise")
    opener, encoding = _text_source(path, config, whole=fmt == "text")
    parse = pcsv.ParseOptions(delimiter=delimiter, quote_char=quote, newlines_in_values=bool(quote))
    read = pcsv.ReadOptions(autogenerate_column_names=True, encoding=encoding)
    with opener() as stream, pcsv.open_csv(stream, read, parse) as first:
        names = [f"f{i}" for i in range(len(first.schema))]
    strings = pcsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()))
    with opener() as stream:
        for batch in pcsv.open_csv(stream, read, parse, strings):
            if escape and any(pc.any(pc.match_substring(c, escape)).as_py() for c in batch.columns):
                raise Unsupported("an escape character, which Python's csv reads its own way")
            yield batch


JSON_TYPES = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}


def _json_type(kind: str) -> pa.DataType:
    """The JSON type ``convert`` takes a value of ``kind`` in as it is (a string where it parses
    text): pyarrow's read of any other fails."""
    base, args = kind_args(kind)
    if base == "map":
        raise Unsupported("a map from JSON, which pyarrow reads only as a struct")
    if base in ("array", "row"):
        members = [(n, _json_type(k)) for n, k in row_fields(kind)] if base == "row" else []
        return pa.list_(_json_type(args[0])) if base == "array" else pa.struct(members)
    return JSON_TYPES.get(family(kind), pa.string())


def _json_lines(path: Path, config: dict, kind: pa.StructType, from_path: set[str]):
    """Each non-blank line parsed alone, as ``json.loads`` parses it: wrapped as ``{"v": line}``,
    a line that is not one object fails pyarrow's read."""
    import pyarrow.json as pjson

    keys = [_key_pattern(n) for n in sorted(from_path)]
    schema = pa.schema([("v", kind)])
    parse = pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    for batch in _delimited(path, config, "json"):
        lines = batch.column(0)  # a second column: a record separator, which JSON refuses
        lines = lines.filter(pc.not_equal(pc.utf8_trim(lines, PY_SPACE), ""))
        named = any(pc.any(pc.match_substring_regex(lines, k)).as_py() for k in keys)
        if named or batch.num_columns > 1:
            raise Unsupported("a line naming a field its directory gives")
        if not len(lines):
            continue
        wrapped = joined(pc.binary_join_element_wise('{"v": ', lines, "}\n", ""))
        options = pjson.ReadOptions(block_size=max(len(wrapped), 1 << 20))
        table = pjson.read_json(pa.BufferReader(wrapped), options, parse)
        if table.num_rows != len(lines):
            raise Unsupported("a line holding more than one value")
        yield pa.RecordBatch.from_struct_array(table.column("v").combine_chunks().cast(kind))


def _key_pattern(name: str) -> str:
    """``name`` as a JSON object's key, each character as it is or escaped (``\\u0069``)."""
    hexes = ["".join(f"[{h}{h.upper()}]" for h in f"{ord(c):04x}") for c in name]
    either = "".join(f"(?:{re.escape(c)}|\\\\u{h})" for c, h in zip(name, hexes, strict=True))
    return f'"{either}"[ \\t\\r\\n]*:'


def joined(lines: pa.Array) -> bytes:
    """The concatenated text of a string array without nulls, straight from its buffer."""
    if not len(lines):
        return b""
    _, offsets, data = lines.buffers()
    bounds = pa.Array.from_buffers(pa.int32(), len(lines) + 1, [None, offsets], offset=lines.offset)
    return data[bounds[0].as_py() : bounds[-1].as_py()].to_pybytes()


def _excel_records(path: Path, config: dict):
    from openpyxl import load_workbook

    book = load_workbook(path, read_only=True, data_only=True)
    try:
        sheet = book[config["sheet_name"]] if config.get("sheet_name") else book.worksheets[0]
        for row in sheet.iter_rows(values_only=True):
            if any(v is not None for v in row):
                yield list(row)
    finally:
        book.close()


def _binary_records(path: Path, config: dict, relative: str):
    chunk = config.get("binary_chunk_size") or 1024
    with open(path, "rb") as fh:
        if config.get("binary_complete_file_mode"):
            yield [fh.read(), relative, 0]
            return
        index = 0
        while data := fh.read(chunk):
            yield [data, relative, index]
            index += 1


# -- writing -------------------------------------------------------------------------------------


class PartFile:
    """One part being written: rows in, a complete file on ``close()`` (flushed, fsynced)."""

    def __init__(self, path: Path, schema: Schema, config: dict) -> None:
        self.path = path
        self.schema = schema
        self.config = config
        self.rows = 0

    def write(self, rows: list[tuple]) -> None:
        raise NotImplementedError

    def put(self, encoded: Any, rows: int) -> None:
        """``rows`` rows that the sink encoded from a batch (text, or a table for pyarrow)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def discard(self) -> None:
        try:
            self.close()
        finally:
            self.path.unlink(missing_ok=True)


class TextPart(PartFile):
    """text, csv and json lines."""

    def __init__(self, path: Path, schema: Schema, config: dict) -> None:
        super().__init__(path, schema, config)
        self.raw = open(path, "wb")
        gz = config.get("compress_codec") == "gzip"
        self.binary: Any = gzip.GzipFile(fileobj=self.raw, mode="wb") if gz else self.raw
        self.fh = io.TextIOWrapper(
            self.binary, encoding=config.get("encoding") or "utf-8", newline=""
        )
        self.format = config["file_format_type"]
        self.row_delimiter = text_delimiter(config.get("row_delimiter") or "\n")
        self.field_delimiter = text_delimiter(config["field_delimiter"])
        self.csv = None
        if self.format == "csv":
            self.csv = csv.writer(
                self.fh, delimiter=self.field_delimiter, lineterminator=self.row_delimiter
            )
        if config.get("header") and self.format in ("csv", "text"):
            self._lines([schema.names])

    def _lines(self, rows) -> None:
        if self.csv is not None:
            self.csv.writerows(rows)
            return
        out = io.StringIO()
        for row in rows:
            out.write(self.field_delimiter.join("" if v is None else _text(v) for v in row))
            out.write(self.row_delimiter)
        self.fh.write(out.getvalue())

    def write(self, rows: list[tuple]) -> None:
        self.rows += len(rows)
        if self.format != "json":
            self._lines(rows)
            return
        out = io.StringIO()
        fields = self.schema.fields
        for row in rows:
            record = {n: jsonable(k, v) for (n, k), v in zip(fields, row, strict=True)}
            out.write(json.dumps(record, default=str))
            out.write("\n")
        self.fh.write(out.getvalue())

    def put(self, encoded: str, rows: int) -> None:
        self.rows += rows
        self.fh.write(encoded)

    def close(self) -> None:
        if self.fh.closed:
            return
        self.fh.flush()
        if self.binary is not self.raw:
            self.binary.close()  # writes the gzip trailer; the raw file stays open
        self.raw.flush()
        os.fsync(self.raw.fileno())
        self.fh.close() if self.binary is self.raw else self.raw.close()


def _text(value) -> str:
    if isinstance(value, list | dict | tuple):
        return json.dumps(value, default=str)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class ArrowPart(PartFile):
    """Parquet or ORC: each batch becomes a row group (Parquet) or stripe data (ORC)."""

    def __init__(self, path: Path, schema: Schema, config: dict) -> None:
        from engine.connectors.arrowrows import arrow_schema

        super().__init__(path, schema, config)
        self.arrow_schema = arrow_schema(schema)
        codec = config.get("compress_codec") or "none"
        if config["file_format_type"] == "parquet":
            import pyarrow.parquet as pq

            self.writer = pq.ParquetWriter(path, self.arrow_schema, compression=codec)
        else:
            from pyarrow import orc

            codec = "uncompressed" if codec == "none" else codec
            self.writer = orc.ORCWriter(str(path), compression=codec)
        self.closed = False

    def write(self, rows: list[tuple]) -> None:
        from engine.connectors.arrowrows import to_table

        if not rows:
            return
        self.rows += len(rows)
        self.writer.write(to_table(rows, self.schema, self.arrow_schema))

    def put(self, encoded: pa.Table, rows: int) -> None:
        self.rows += rows
        self.writer.write(encoded)

    def close(self) -> None:
        if self.closed:
            return
        if self.rows == 0 and self.config["file_format_type"] == "orc":
            self.write_empty()
        self.writer.close()
        self.closed = True
        with open(self.path, "rb") as fh:
            os.fsync(fh.fileno())

    def write_empty(self) -> None:
        self.writer.write(self.arrow_schema.empty_table())


class ExcelPart(PartFile):
    """An .xlsx workbook of one sheet (``sheet_name``), written when the part closes."""

    def __init__(self, path: Path, schema: Schema, config: dict) -> None:
        from openpyxl import Workbook

        super().__init__(path, schema, config)
        self.book = Workbook(write_only=True)
        self.sheet = self.book.create_sheet(config.get("sheet_name") or "Sheet1")
        if config.get("header"):
            self.sheet.append(schema.names)
        self.saved = False

    def write(self, rows: list[tuple]) -> None:
        self.rows += len(rows)
        kinds = self.schema.kinds
        for row in rows:
            self.sheet.append([_cell(k, v) for k, v in zip(kinds, row, strict=True)])

    def close(self) -> None:
        if self.saved:
            return
        self.book.save(self.path)
        self.saved = True
        with open(self.path, "rb") as fh:
            os.fsync(fh.fileno())


def _cell(kind: str, value):
    if value is None or isinstance(value, int | float | str | bool):
        return value
    if isinstance(value, Decimal):
        return float(value) if kind_args(kind)[0] != "decimal" else str(value)
    return _text(value)


class BinaryPart(PartFile):
    """A binary sink's file: the ``data`` chunks of one ``relativePath``, in ``partIndex``
    order, concatenated."""

    def __init__(self, path: Path, schema: Schema, config: dict) -> None:
        super().__init__(path, schema, config)
        self.fh = open(path, "wb")

    def write(self, rows: list[tuple]) -> None:
        self.rows += len(rows)
        for row in rows:
            self.fh.write(row[0] or b"")

    def close(self) -> None:
        if self.fh.closed:
            return
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()


def open_part(path: Path, schema: Schema, config: dict) -> PartFile:
    fmt = config["file_format_type"]
    if fmt in ("parquet", "orc"):
        return ArrowPart(path, schema, config)
    if fmt == "excel":
        return ExcelPart(path, schema, config)
    if fmt == "binary":
        return BinaryPart(path, schema, config)
    return TextPart(path, schema, config)
