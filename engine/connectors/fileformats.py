"""The file formats of LocalFile: how a file's records are read and how a part is written.

Every format reads to records (lists by position, or dicts by name) that the source converts to
the schema, and writes through a ``PartFile`` that the sink publishes with a rename once closed.
Parquet and ORC go through pyarrow, Excel through openpyxl; text, csv and json are written here
(a few lines each), optionally gzip-compressed.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from engine.connectors.schema import Schema, jsonable, kind_args

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
        yield from _arrow_records(path, fmt, names)
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


def _arrow_records(path: Path, fmt: str, names: list[str]):
    if fmt == "parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        wanted = [n for n in names if n in parquet.schema_arrow.names] or None
        for batch in parquet.iter_batches(batch_size=4096, columns=wanted):
            yield from batch.to_pylist()
    else:
        from pyarrow import orc

        table = orc.ORCFile(path).read()
        for batch in table.to_batches(4096):
            yield from batch.to_pylist()


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
