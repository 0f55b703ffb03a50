"""LocalFile source: text, csv, json lines, Parquet, ORC, Excel and binary files on the local
file system (formats in ``fileformats``), and what the source and the sink share (the sink is
in ``localfile_sink``)."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from engine.connectors.arrowrows import arrow_schema, arrow_type
from engine.connectors.base import Option, SourcePlugin
from engine.connectors.boundaries import Refused, resolve_file_path
from engine.connectors.fake import FakeSource
from engine.connectors.fileformats import (
    ARROW_FAILURES,
    BINARY_SCHEMA,
    CODECS,
    FORMATS,
    PY_SPACE,
    Unsupported,
    arrow_records,
    arrow_schema_of,
    family,
    records,
    text_delimiter,
)
from engine.connectors.localfile_options import (
    DISCOVERY_OPTIONS,
    SCHEMA_CHANGES_HELP,
    SOURCE_IGNORED,
)
from engine.connectors.registry import register
from engine.connectors.schema import Schema, convert, kind_args, parse_schema, row_fields
from engine.sourceruntime.capability import ManagedSourceCapability

FILE_FORMAT = Option(
    "file_format_type", str, default="csv", help=", ".join(FORMATS) + " (any case)"
)
FIELD_DELIMITER = Option(
    "field_delimiter", str, help="between fields (text and csv); default \\001 for text, , for csv"
)
ROW_DELIMITER = Option("row_delimiter", str, default="\n", help="between rows (text)")
COMPRESS = Option("compress_codec", str, default="none", help="per format: see the docs")
ENCODING = Option("encoding", str, default="UTF-8", help="of text, csv and json files")
SHEET = Option("sheet_name", str, help="the Excel sheet (default: the first; Sheet1 written)")
#: A null partition value's directory name (Hive's).
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


class LocalFile:
    """The name of the LocalFile source and sink, and the checks they share."""

    name = "LocalFile"
    aliases = {"file_format": "file_format_type"}

    @staticmethod
    def check_format(config: dict) -> list[tuple[str, str]]:
        fmt = config["file_format_type"] = config["file_format_type"].strip().lower()
        if fmt not in FORMATS:
            hint = " (Keel has no xml format)" if fmt == "xml" else ""
            hint = " (a variable not given with the submission)" if "${" in fmt else hint
            return [("file_format_type", f"must be one of {', '.join(FORMATS)}{hint}")]
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
        Option("path", str, help="a file, or a directory of files (required)"),
        FILE_FORMAT,
        Option("schema", dict, help="schema { fields { name = type } } (Parquet, ORC: optional)"),
        Option("tables_configs", list, help="[{ path, schema { table } ... }]: a pipeline each"),
        Option("read_partitions", list, help="read only files whose path holds one of these"),
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
        *DISCOVERY_OPTIONS,
        Option("schema-changes.enabled", bool, default=False, help=SCHEMA_CHANGES_HELP),
    )
    #: Runs in the managed lane (Lane A) when allowed: bounded poll turns over file splits,
    #: discovery on the coordinator's async workers (engine.connectors.managed).
    managed_capability = ManagedSourceCapability(async_enumerator=True)
    #: Options that only the managed lane acts on (warned about in Lane B).
    managed_only_options = (*(o.name for o in DISCOVERY_OPTIONS), "schema-changes.enabled")
    aliases = LocalFile.aliases | {
        "skip_header_row_number": "skip_header_rows",
        "delimiter": "field_delimiter",
    }
    ignored_options = SOURCE_IGNORED

    tables_option = "tables_configs"

    @classmethod
    def table_entry_problem(cls, entry):
        schema = entry.get("schema") if isinstance(entry, dict) else None
        if not isinstance(schema, dict) or not schema.get("table"):
            return "needs schema { table = name } (and its fields, but for Parquet and ORC)"
        return None

    @classmethod
    def placeholder_names(cls, config):
        """Its ``schema.table`` names the table, as a FakeSource's does."""
        return FakeSource.placeholder_names(config)

    @classmethod
    def check(cls, config):
        if config.get("tables_configs"):
            return []  # each entry is checked as a source of its own (engine.jobs.multitable)
        if config["path"] is None:
            return [("path", "is required")]
        errors = cls.check_format(config)
        fmt, schema = config["file_format_type"], config["schema"]
        inferred = fmt in ("parquet", "orc") and not (schema or {}).get("fields")
        if schema is not None and not inferred:
            errors += parse_schema(schema)[1]
        elif schema is None and fmt not in ("parquet", "orc", "binary"):
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
        elif not errors and inferred:
            first = found[0]
            try:
                fields = dict(arrow_schema_of(first, fmt).fields)
                config["schema"] = {**(schema or {}), "fields": fields}
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

    #: The schema a managed reader's schema change put in effect (None: the config's).
    evolved: Schema | None = None

    def output_schema(self) -> Schema:
        if self.evolved is not None:
            return self.evolved
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

    def read(self, split: dict, offset: int, mode: str, batch_size: int):
        """The file's records from ``offset`` as batches made by pyarrow's readers (offsets count
        records as ``read_rows`` does). A format, option or value that they cannot read as the
        row path does goes through rows from where the batches stopped."""
        done = offset
        try:
            for batch in self.batches(resolve_file_path(split["path"]), offset, batch_size):
                done += batch.num_rows
                yield batch, done
        except ARROW_FAILURES:
            yield from super().read(split, done, mode, batch_size)

    def batches(self, path: Path, offset: int, batch_size: int) -> Iterator[pa.RecordBatch]:
        """The output batches of the file's records from ``offset``, fields found as
        ``converter`` finds them (a record of another width is Unsupported)."""
        out, null = self.output_schema(), self.config.get("null_format")
        partition = self.partition_of(path)
        found = arrow_records(path, self.config, list(out.fields), set(partition))
        found = _skipping(found, self.config["skip_header_rows"])
        first = next(found, None)
        if first is None:
            return
        if self.config.get("csv_use_header_line") and self.config["file_format_type"] == "csv":
            columns = {h: f"f{i}" for i, h in enumerate(c[0].as_py() for c in first.columns)}
            first = first.slice(1)
        else:
            columns = self.columns_of(first, partition)
        schema = arrow_schema(out)
        for batch in _skipping(itertools.chain([first], found), offset):
            for start in range(0, batch.num_rows, batch_size):
                part = batch.slice(start, batch_size)
                yield pa.RecordBatch.from_arrays(
                    [
                        conform(part.column(columns[n]), k, null)
                        if n in columns
                        else pa.repeat(conform(pa.array([partition.get(n)]), k, null)[0], len(part))
                        for n, k in out.fields
                    ],
                    schema=schema,
                )

    def columns_of(self, batch: pa.RecordBatch, partition: dict) -> dict[str, str]:
        """Which column of the file's batches holds each field (the rest: from the path)."""
        names, fmt = batch.schema.names, self.config["file_format_type"]
        if fmt not in ("text", "csv"):  # a json line's field never shadows the path's
            return {n: n for n in names if not (fmt == "json" and n in partition)}
        full = self.full_schema(self.config).names
        in_file = [n for n in full if n not in partition]
        if len(names) != len(full) and not (partition and len(names) == len(in_file)):
            raise Unsupported(f"records of {len(names)} fields, the schema {len(full)}")
        return dict(zip(full if len(names) == len(full) else in_file, names, strict=True))

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
        partition = self.partition_of(path)
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

    def partition_of(self, path: Path) -> dict[str, str | None]:
        """The fields that the ``k=v`` directories of ``path`` under the source's path give."""
        if not self.config.get("parse_partition_from_path"):
            return {}
        root = resolve_file_path(self.config["path"])
        relative = path.parent.relative_to(root) if root.is_dir() else Path()
        return {
            k: None if v == HIVE_NULL else unquote(v)  # the sink's escaping, undone
            for k, v in (p.split("=", 1) for p in relative.parts if "=" in p)
        }


def _skipping(batches: Iterator[pa.RecordBatch], count: int) -> Iterator[pa.RecordBatch]:
    """``batches`` without their first ``count`` rows."""
    for batch in batches:
        if count < batch.num_rows:
            yield batch.slice(count)
            count = 0
        else:
            count -= batch.num_rows


def _files(directory: Path, config: dict) -> list[Path]:
    """``walk_files`` in name order, as SeaTunnel lists them."""
    return sorted(walk_files(directory, config))


def walk_files(directory: Path, config: dict) -> Iterator[Path]:
    """The files under ``directory`` (partition directories included), one at a time (one
    directory's names at once, not a path per file): hidden ones (Keel's staging directory
    too), empty ones and ``_SUCCESS`` markers left out, matching ``file_filter_pattern`` if
    set, and with ``read_partitions`` only those whose path holds one of them."""
    pattern = (
        re.compile(config.get("file_filter_pattern")) if config.get("file_filter_pattern") else None
    )
    partitions = [str(p) for p in config.get("read_partitions") or []]
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            path = Path(root) / name
            if name.startswith(".") or name == "_SUCCESS" or (pattern and not pattern.search(name)):
                continue
            if partitions and not any(p in str(path) for p in partitions):
                continue
            if os.path.getsize(path) == 0:
                continue
            # A link is followed only to a file inside the roots (Refused names it otherwise).
            yield resolve_file_path(str(path)) if os.path.islink(path) else path


# -- values as the row path converts them (schema.convert), a column at a time ---------------------

#: Spellings that pyarrow's parsers read as Python does (``0x1f`` or ``...T10:00Z`` go as rows).
TEXT = {
    "integer": r"^-?[0-9]+$",
    "number": r"^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$",
    "date": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
    "time": r"^[0-9]{2}(:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?)?$",
    "timestamp": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"([T ][0-9]{2}(:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?)?)?$",
}
TRUE = pa.array(["true", "1", "t", "yes"])


def conform(column: pa.Array, kind: str, null: str | None) -> pa.Array:
    """``column``, as a file holds it, in ``kind``'s Arrow type valued as ``convert`` values it;
    Unsupported (or pyarrow's error) where the whole column cannot be converted so."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_large_string(column.type) or str(column.type) == "string_view":
        column = column.cast(pa.string())
    source, target, kinds = column.type, arrow_type(kind), family(kind)
    if kinds == "null" or pa.types.is_null(source):
        return pa.nulls(len(column), target)
    if pa.types.is_string(source):
        empty = pc.or_kleene(pc.equal(column, ""), pc.equal(column, null or ""))
        return _from_text(pc.if_else(empty, None, column), kinds, target)
    if kinds in ("array", "map", "row"):
        return _nested(column, kind, null)
    if kinds == "boolean" and pa.types.is_integer(source):
        return pc.equal(column, 1)  # str(value) is "1" for 1 only
    if kinds == "decimal" and pa.types.is_integer(source):
        column = column.cast(pa.decimal128(38, target.scale))  # wide enough for any integer
    if source == target or _castable(column.type, kinds):
        return column.cast(target)  # safe: what would round or overflow fails
    raise Unsupported(f"{source} as {kind}")


def _castable(source: pa.DataType, kinds: str) -> bool:
    """Whether pyarrow's safe cast from ``source`` gives what ``convert`` does (or fails)."""
    t = pa.types
    whole = t.is_integer(source) or t.is_boolean(source)
    return {
        "integer": whole or t.is_floating(source) or t.is_decimal(source),
        "number": whole or t.is_floating(source),
        "decimal": t.is_decimal(source),
        "string": t.is_integer(source),
        "bytes": t.is_binary(source) or t.is_large_binary(source) or t.is_fixed_size_binary(source),
        "date": t.is_date(source),
        "time": t.is_time(source),
        "timestamp": t.is_timestamp(source) or t.is_date(source),
    }.get(kinds, False)


def _from_text(column: pa.Array, kinds: str, target: pa.DataType) -> pa.Array:
    """Text as ``convert`` reads it, for the spellings that pyarrow parses the same way."""
    if kinds in ("string", "bytes"):
        return column.cast(target)
    if kinds == "boolean":
        words = pc.utf8_lower(pc.utf8_trim(column, PY_SPACE))
        return pc.if_else(pc.is_null(column), None, pc.is_in(words, TRUE))
    spelling = TEXT.get("number" if kinds == "decimal" else kinds)
    if spelling is None or pc.any(pc.invert(pc.match_substring_regex(column, spelling))).as_py():
        raise Unsupported(f"{kinds} text that pyarrow does not read as Python does")
    if kinds in ("date", "timestamp") and pc.any(pc.starts_with(column, "0000")).as_py():
        raise Unsupported("year 0, which Python refuses")
    if kinds == "time":  # a time of day of the epoch, as pyarrow parses timestamps only
        column = pc.binary_join_element_wise("1970-01-01T", column, "").cast(pa.timestamp("us"))
    return column.cast(pa.float64() if kinds == "number" else target).cast(target)


def _nested(column: pa.Array, kind: str, null: str | None) -> pa.Array:
    """Arrays, maps and rows converted member by member, as ``convert`` recurses."""
    base, args = kind_args(kind)
    mask, source, target = column.is_null(), column.type, arrow_type(kind)
    if base == "row" and pa.types.is_struct(source):
        present = [source.field(i).name for i in range(source.num_fields)]
        if len(set(present)) != len(present):
            raise Unsupported("a struct naming a field twice")
        children = [
            conform(column.field(n), k, null) if n in present else pa.nulls(len(column), f.type)
            for (n, k), f in zip(row_fields(kind), target, strict=True)
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    lists = pa.types.is_list(source) or pa.types.is_large_list(source)
    if not (base == "array" and lists) and not (base == "map" and pa.types.is_map(source)):
        raise Unsupported(f"{source} as {kind}")
    column = pa.concat_arrays([column])  # not sliced: its offsets index its members
    offsets = column.offsets.cast(pa.int32())
    if base == "array":
        members = conform(column.values, args[0], null)
        return pa.ListArray.from_arrays(offsets, members, type=target, mask=mask)
    if has_repeated_keys(column):
        raise Unsupported("a map repeating a key, which the row path keeps once")
    keys, items = conform(column.keys, args[0], None), conform(column.items, args[1], None)
    return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=mask)


def has_repeated_keys(column: pa.Array) -> bool:
    """Whether some map of ``column`` holds a key twice (a dict in the row path keeps one)."""
    t = column.type  # as lists of entries, which pyarrow's list functions take
    entries = column.cast(pa.list_(pa.struct([t.key_field, t.item_field])))
    pairs = pa.table({"row": pc.list_parent_indices(entries), "key": entries.flatten().field(0)})
    return pairs.group_by(["row", "key"]).aggregate([]).num_rows < pairs.num_rows
