"""LocalFile source: text, csv, json lines, Parquet, ORC, Excel and binary files on the local
file system (formats in ``fileformats``), and what the source and the sink share (the sink is
in ``localfile_sink``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from engine.connectors.base import Option, SourcePlugin
from engine.connectors.boundaries import Refused, resolve_file_path
from engine.connectors.fileformats import (
    BINARY_SCHEMA,
    CODECS,
    FORMATS,
    arrow_schema_of,
    records,
    text_delimiter,
)
from engine.connectors.registry import register
from engine.connectors.schema import Schema, convert, parse_schema
from engine.sourceruntime.capability import ManagedSourceCapability

FILE_FORMAT = Option("file_format_type", str, default="csv", choices=FORMATS)
FIELD_DELIMITER = Option(
    "field_delimiter", str, help="between fields (text and csv); default \\001 for text, , for csv"
)
ROW_DELIMITER = Option("row_delimiter", str, default="\n", help="between rows (text)")
COMPRESS = Option("compress_codec", str, default="none", help="per format: see the docs")
ENCODING = Option("encoding", str, default="UTF-8", help="of text, csv and json files")
SHEET = Option("sheet_name", str, help="the Excel sheet (default: the first; Sheet1 written)")
TMP_DIR = ".keel-tmp"
#: A null partition value's directory name (Hive's).
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
#: SeaTunnel's options of both sides that Keel reads and writes one way only.
ISO_DATES = "dates, times and timestamps are read and written in ISO 8601"
COMMON_IGNORED = {
    "date_format": ISO_DATES,
    "datetime_format": ISO_DATES,
    "time_format": ISO_DATES,
    "xml_root_tag": "Keel has no xml format",
    "xml_row_tag": "Keel has no xml format",
    "xml_use_attr_format": "Keel has no xml format",
}


class LocalFile:
    """The name of the LocalFile source and sink, and the checks they share."""

    name = "LocalFile"
    aliases = {"file_format": "file_format_type"}

    @staticmethod
    def check_format(config: dict) -> list[tuple[str, str]]:
        fmt = config["file_format_type"]
        errors = []
        if config["field_delimiter"] is None:
            config["field_delimiter"] = "\x01" if fmt == "text" else ","
        delimiter = text_delimiter(config["field_delimiter"])
        if fmt == "csv" and len(delimiter) != 1:
            errors.append(("field_delimiter", "must be one character for csv"))
        elif not delimiter:
            errors.append(("field_delimiter", "must not be empty"))
        codec = (config["compress_codec"] or "none").lower()
        config["compress_codec"] = codec
        if codec not in CODECS[fmt]:
            hint = " (Keel has no LZO codec)" if codec == "lzo" else ""
            errors.append(("compress_codec", f"{fmt} takes one of {', '.join(CODECS[fmt])}{hint}"))
        return errors


def within_roots(config: dict) -> Path:
    """The configured path, resolved, if it lies inside a file root (Refused otherwise). The
    plan keeps the resolved path, and the worker checks it again before it opens anything."""
    path = config["path"]
    if path.startswith("file://"):
        path = path[len("file://") :]
    resolved = resolve_file_path(path)
    config["path"] = str(resolved)
    return resolved


@register
class LocalFileSource(LocalFile, SourcePlugin):
    options = (
        Option("path", str, required=True, help="a file, or a directory of files"),
        FILE_FORMAT,
        Option("schema", dict, help="schema { fields { name = type } } (Parquet, ORC: optional)"),
        Option("read_columns", list, help="the fields to read, in this order (default: all)"),
        FIELD_DELIMITER,
        ROW_DELIMITER,
        Option("skip_header_rows", int, default=0, min=0),
        Option("csv_use_header_line", bool, default=False, help="csv: map fields by the header"),
        Option("quote_char", str, default='"', help="csv"),
        Option("escape_char", str, help="csv"),
        Option("null_format", str, help="the text that stands for null (text, csv)"),
        Option("file_filter_pattern", str, help="a regular expression file names must match"),
        Option(
            "parse_partition_from_path",
            bool,
            default=True,
            help="fill fields named in k=v directories from the path",
        ),
        Option("binary_chunk_size", int, default=1024, min=1),
        Option("binary_complete_file_mode", bool, default=False),
        COMPRESS,
        ENCODING,
        SHEET,
        Option(
            "file.discovery.interval",
            int,
            min=1,
            help="ms between scans of the directory for new files (managed lane, STREAMING)",
        ),
    )
    #: Runs in the managed lane (Lane A) when allowed: bounded poll turns over file splits,
    #: discovery on the coordinator's async workers (engine.connectors.managed).
    managed_capability = ManagedSourceCapability(async_enumerator=True)
    #: Options that only the managed lane acts on (warned about in Lane B).
    managed_only_options = ("file.discovery.interval",)
    aliases = LocalFile.aliases | {
        "skip_header_row_number": "skip_header_rows",
        "delimiter": "field_delimiter",
    }
    ignored_options = COMMON_IGNORED | {
        "archive_compress_codec": "archives are not opened; point path at the files",
    }

    @classmethod
    def check(cls, config):
        errors = cls.check_format(config)
        fmt = config["file_format_type"]
        if config["schema"] is not None:
            errors += parse_schema(config["schema"])[1]
        elif fmt not in ("parquet", "orc", "binary"):
            errors.append(("schema", f"is required for {fmt} files"))
        try:
            path = within_roots(config)
        except Refused as exc:
            return [*errors, ("path", str(exc))]
        if config.get("file_filter_pattern") is not None:
            try:
                re.compile(config.get("file_filter_pattern"))
            except re.error as exc:
                errors.append(("file_filter_pattern", f"not a regular expression: {exc}"))
                return errors
        try:
            found = _files(path, config) if path.is_dir() else [path]
        except Refused as exc:
            return [*errors, ("path", str(exc))]
        if not path.exists():
            errors.append(("path", f"no such file or directory: {path}"))
        elif not found and not (config.get("file.discovery.interval") and config["schema"]):
            errors.append(("path", f"the directory {path} holds no files"))
        elif not errors and config["schema"] is None and fmt in ("parquet", "orc"):
            first = found[0]
            try:
                config["schema"] = {"fields": dict(arrow_schema_of(first, fmt).fields)}
            except Exception as exc:  # a file pyarrow cannot read: the user's input
                errors.append(("path", f"{first} is not a {fmt} file: {exc}"))
        if not errors and config.get("read_columns") is not None:
            names = cls.full_schema(config).names
            unknown = [c for c in config.get("read_columns") if c not in names]
            if unknown:
                errors.append(("read_columns", f"not in the schema: {', '.join(unknown)}"))
        return errors

    @staticmethod
    def full_schema(config: dict) -> Schema:
        if config["file_format_type"] == "binary":
            return BINARY_SCHEMA
        return parse_schema(config["schema"])[0]

    def output_schema(self) -> Schema:
        schema = self.full_schema(self.config)
        if self.config.get("read_columns"):
            return schema.project(self.config.get("read_columns"))
        return schema

    def files(self) -> list[Path]:
        path = resolve_file_path(self.config["path"])
        return [path] if path.is_file() else _files(path, self.config)

    def create_splits(self, mode: str) -> list[dict]:
        root = resolve_file_path(self.config["path"])
        return [
            {
                "splitId": f"file-{i}",
                "path": str(p),
                "relativePath": p.relative_to(root).as_posix() if root.is_dir() else p.name,
            }
            for i, p in enumerate(self.files())
        ]

    def read_rows(self, split: dict, offset: int, mode: str, batch_size: int):
        """Records of the file from ``offset`` (records, not lines: blank lines are skipped and
        a quoted CSV field may span lines). A record of the wrong width fails the task."""
        path = resolve_file_path(split["path"])  # inside the roots still, links followed
        convert_record = self.converter(path)
        names = self.full_schema(self.config).names
        source = records(path, self.config, names, split.get("relativePath") or path.name)
        for _ in range(self.config["skip_header_rows"]):
            if next(source, None) is None:
                return
        if self.config.get("csv_use_header_line") and self.config["file_format_type"] == "csv":
            header = next(source, None)
            if header is None:
                return
            source = (dict(zip(header, r, strict=False)) for r in source)
        batch = []
        for number, record in enumerate(source):
            if number < offset:
                continue
            try:
                batch.append(convert_record(record))
            except (ValueError, TypeError, ArithmeticError) as exc:
                raise ValueError(f"{split['path']}: record {number + 1}: {exc}") from None
            if len(batch) >= batch_size:
                offset += len(batch)
                yield batch, offset
                batch = []
        if batch:
            offset += len(batch)
            yield batch, offset

    def converter(self, path: Path):
        """A function from one record to a row of the output schema."""
        full = self.full_schema(self.config)
        out = self.output_schema()
        null = self.config.get("null_format")
        partition = {}
        if self.config.get("parse_partition_from_path"):
            root = resolve_file_path(self.config["path"])
            relative = path.parent.relative_to(root) if root.is_dir() else Path()
            partition = {
                k: None if v == HIVE_NULL else unquote(v)  # the sink's escaping, undone
                for k, v in (p.split("=", 1) for p in relative.parts if "=" in p)
            }
        from_path = [n for n in full.names if n in partition]
        in_file = [n for n in full.names if n not in partition]
        wanted = [(n, k) for n, k in out.fields]

        def from_list(record: list) -> tuple:
            if len(record) == len(full.names):
                values = dict(zip(full.names, record, strict=True))
            elif from_path and len(record) == len(in_file):
                values = dict(zip(in_file, record, strict=True)) | partition
            else:
                raise ValueError(f"has {len(record)} fields, the schema {len(full.names)}")
            return tuple(convert(k, values[n], null) for n, k in wanted)

        def from_dict(record: dict) -> tuple:
            return tuple(
                convert(k, record[n] if n in record else partition.get(n), null) for n, k in wanted
            )

        def convert_record(record) -> tuple:
            if isinstance(record, list):
                return from_list(record)
            if isinstance(record, dict):
                return from_dict(record)
            raise ValueError("is not an object")

        return convert_record


def _files(directory: Path, config: dict) -> list[Path]:
    """The files under ``directory`` (partition directories included), hidden ones and Keel's
    staging directory left out, matching ``file_filter_pattern`` if set, in name order."""
    pattern = (
        re.compile(config.get("file_filter_pattern")) if config.get("file_filter_pattern") else None
    )
    found = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if name.startswith(".") or (pattern and not pattern.search(name)):
                continue
            # A link is followed only to a file inside the roots (Refused names it otherwise).
            found.append(
                resolve_file_path(str(Path(root) / name))
                if os.path.islink(Path(root) / name)
                else Path(root) / name
            )
    return sorted(found)
