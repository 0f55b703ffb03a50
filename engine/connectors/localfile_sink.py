"""LocalFile sink: each reader's rows go to hidden temporary parts (one per partition
directory), published with an atomic rename when the task group finishes or, checkpointed, when
the checkpoint that sealed them completes; a cancelled or failed attempt publishes nothing, so a
restarted pipeline never leaves duplicates behind."""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from engine.connectors import filesavemodes
from engine.connectors.arrowrows import arrow_schema
from engine.connectors.base import Option, SinkPlugin, SinkWriter, later_sink
from engine.connectors.boundaries import Refused, resolve_file_path
from engine.connectors.fileformats import (
    ARROW_FAILURES,
    SUFFIX,
    PartFile,
    Unsupported,
    family,
    joined,
    open_part,
    text_delimiter,
)
from engine.connectors.localfile import (
    COMPRESS,
    ENCODING,
    FIELD_DELIMITER,
    FILE_FORMAT,
    HIVE_NULL,
    ROW_DELIMITER,
    SHEET,
    LocalFile,
    has_repeated_keys,
    within_roots,
)
from engine.connectors.localfile_options import SINK_IGNORED, TMP_DIR
from engine.connectors.registry import register
from engine.connectors.schema import Schema, kind_args, row_fields


def java_time_format(pattern: str) -> str:
    """SeaTunnel's ``filename_time_format`` (Java's SimpleDateFormat letters) as strftime."""
    out, i = [], 0
    table = {"yyyy": "%Y", "yy": "%y", "MM": "%m", "dd": "%d", "HH": "%H", "mm": "%M", "ss": "%S"}
    while i < len(pattern):
        for token, code in table.items():
            if pattern.startswith(token, i):
                out.append(code)
                i += len(token)
                break
        else:
            out.append(pattern[i].replace("%", "%%"))
            i += 1
    return "".join(out)


def partition_value(value) -> str:
    """A value as a directory name: Hive's escaping of the characters a path gives meaning to
    (``/``, ``%``, a leading dot), so a row can never lead a part out of the sink's path nor
    hide it from a reader (which skips hidden directories)."""
    text = HIVE_NULL if value is None else str(value)
    text = text.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C")
    return "%2E" + text[1:] if text.startswith(".") else text


class Layout:
    """Where a sink's rows go: which columns, which partition directory, which file name."""

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        self.config = config
        self.directory = resolve_file_path(config["path"])
        self.format = config["file_format_type"]
        self.ext = SUFFIX[self.format]
        self.key = (
            f"part-{context.get('jobId', 0)}-{context.get('pipelineId', 0)}"
            f"-{context.get('readerIndex', 0)}"
        )
        if later_sink(context):  # a second sink may write the same directory: its own parts
            self.key += f"-k{later_sink(context)}"
        columns = config.get("sink_columns") or schema.names
        self.partition_by = config.get("partition_by") if config.get("have_partition") else []
        if self.partition_by and not config.get("is_partition_field_write_in_file"):
            columns = [c for c in columns if c not in self.partition_by]
        self.schema = schema.project(columns)
        self.kinds = schema.kinds
        self.picks = [schema.index(c) for c in columns]
        self.partition_picks = [schema.index(c) for c in self.partition_by]

    def split(self, rows: list[tuple]) -> dict[str, list[tuple]]:
        """Rows by partition directory ("" without partitions), projected to the columns."""
        picks = self.picks
        if not self.partition_picks:
            return {"": [tuple(row[i] for i in picks) for row in rows]}
        out: dict[str, list[tuple]] = {}
        for row in rows:
            values = [partition_value(row[i]) for i in self.partition_picks]
            out.setdefault(self.partition_dir(values), []).append(tuple(row[i] for i in picks))
        return out

    def split_batch(self, batch: pa.RecordBatch) -> dict[str, pa.RecordBatch]:
        """``split`` for a batch (its row kinds left out): directories as rows first name them."""
        picked = batch.select(self.picks)
        if not self.partition_picks:
            return {"": picked}
        values = []  # partition_value of each value: escaped, so without "/"
        for i in self.partition_picks:
            text = pc.fill_null(py_text(batch.column(i), self.kinds[i]), HIVE_NULL)
            for char, escape in (("%", "%25"), ("/", "%2F"), ("\\", "%5C")):
                text = pc.replace_substring(text, char, escape)
            values.append(pc.replace_substring_regex(text, r"^\.", "%2E"))
        keys = pc.binary_join_element_wise(*values, "/").dictionary_encode()
        names = pa.array([self.partition_dir(k.split("/")) for k in keys.dictionary.to_pylist()])
        groups = names.take(keys.indices).dictionary_encode()
        grouped = picked.take(pc.sort_indices(groups.indices))  # stable: rows keep their order
        counts = pc.value_counts(groups.indices).field("counts")
        starts = pc.subtract(pc.cumulative_sum(counts), counts).to_pylist()
        slices = map(grouped.slice, starts, counts.to_pylist())
        return dict(zip(groups.dictionary.to_pylist(), slices, strict=True))

    def partition_dir(self, values: list[str]) -> str:
        """The directory of the partition fields' values (``partition_value``s)."""
        expression = self.config.get("partition_dir_expression")
        if not expression:
            parts = [f"{k}={v}" for k, v in zip(self.partition_by, values, strict=True)]
            return "/".join(parts)
        for n, (k, v) in enumerate(zip(self.partition_by, values, strict=True)):
            expression = expression.replace(f"${{k{n}}}", k).replace(f"${{v{n}}}", str(v))
        return expression.strip("/")

    def file_name(self, suffix: str = "") -> str:
        """``part-<job>-<pipeline>-<reader>`` (the transaction id), or with ``custom_filename``
        the ``file_name_expression`` (``${transactionId}``, ``${now}``, ``${uuid}``), always
        led by the transaction id when it does not name it: parts of different readers and
        attempts never collide."""
        name = self.key
        if self.config.get("custom_filename"):
            now = datetime.now().strftime(
                java_time_format(self.config.get("filename_time_format") or "yyyy.MM.dd")
            )
            expression = self.config.get("file_name_expression") or "${transactionId}"
            name = (
                expression.replace("${now}", now)
                # Derived from the part, so a rerun of the reader replaces its file.
                .replace("${uuid}", uuid.uuid5(uuid.NAMESPACE_URL, self.key).hex)
                .replace("${transactionId}", self.key)
            )
            if "${transactionId}" not in expression:
                name = f"{self.key}_{name}"
        return f"{name}{suffix}.{self.ext}"

    def target(self, partition: str, suffix: str = "") -> Path:
        directory = self.directory / partition if partition else self.directory
        target = (directory / self.file_name(suffix)).resolve()
        if not target.is_relative_to(self.directory):
            raise ValueError(f"partition directory {partition!r} leaves the sink's path")
        target.parent.mkdir(parents=True, exist_ok=True)
        return target


class LocalFileWriter(SinkWriter):
    """Parts staged under ``.keel-tmp`` (mirroring the partition directories), published when
    the task group finishes."""

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        self.config = config
        self.context = context
        self.layout = Layout(config, schema, context)
        # Resolved inside the roots: a .keel-tmp that is a link cannot send staging elsewhere.
        self.tmp_dir = resolve_file_path(str(self.layout.directory / TMP_DIR))
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.parts: dict[str, PartFile] = {}
        self.opened = 0
        if not self.layout.partition_by and self.layout.format != "binary":
            self.part("")  # an empty input still publishes its (empty) part

    def part(self, partition: str) -> PartFile:
        if partition not in self.parts:
            self.opened += 1
            directory = (self.tmp_dir / partition).resolve() if partition else self.tmp_dir
            if not directory.is_relative_to(self.tmp_dir.resolve()):
                raise ValueError(f"{partition!r} leaves the sink's path")
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / (
                f"{self.layout.key}.attempt-{self.context.get('attempt', 0)}-{self.opened}"
                f".{self.layout.ext}"
            )
            self.parts[partition] = open_part(tmp, self.layout.schema, self.config)
        return self.parts[partition]

    def write(self, batch: pa.RecordBatch) -> None:
        """Each part's rows of the batch encoded whole (``encode``), else the batch as rows."""
        try:
            groups = {p: g for p, g in self.layout.split_batch(batch).items() if g.num_rows}
            encoded = {p: encode(g, self.layout.schema, self.config) for p, g in groups.items()}
        except ARROW_FAILURES:
            super().write(batch)
            return
        for partition, group in groups.items():
            self.part(partition).put(encoded[partition], group.num_rows)

    def write_rows(self, rows: list[tuple]) -> None:
        if self.layout.format == "binary":
            self.write_binary(rows)
            return
        for partition, group in self.layout.split(rows).items():
            self.part(partition).write(group)

    def write_binary(self, rows: list[tuple]) -> None:
        """A binary sink's file per ``relativePath`` (chunks arrive in order)."""
        for row in rows:
            self.part(str(row[1])).write([row])

    def close(self) -> None:
        for partition, part in self.parts.items():
            part.close()
            os.replace(part.path, self.final_path(partition))
        self.parts.clear()

    def final_path(self, partition: str) -> Path:
        if self.layout.format != "binary":
            return self.layout.target(partition)
        target = (self.layout.directory / partition).resolve()
        if not target.is_relative_to(self.layout.directory) or target == self.layout.directory:
            raise ValueError(f"relativePath {partition!r} leaves the sink's path")
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def abort(self) -> None:
        for part in self.parts.values():
            part.discard()
        self.parts.clear()


class CheckpointedLocalFileWriter(LocalFileWriter):
    """A part per checkpoint and partition: barrier N seals the rows written since N-1 into
    pending parts; completion of N publishes them (a rename, so committing twice changes
    nothing). A new attempt publishes the pending parts of the checkpoint it restores from and
    earlier, and discards the rest: those rows are replayed from the checkpoint's offsets."""

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        if config["file_format_type"] == "binary":
            raise ValueError("a binary LocalFile sink runs in BATCH jobs without checkpoints")
        super().__init__(config, schema, context)
        restored = context.get("restoredCheckpoint")
        self._publish_upto(restored if restored is not None else -1)
        for _, _, pending in self._pending_parts():
            pending.unlink()
        for stale in self.tmp_dir.rglob(f"{self.layout.key}.attempt-*"):
            if stale not in {p.path for p in self.parts.values()}:
                stale.unlink()

    def _pending_parts(self) -> list[tuple[int, str, Path]]:
        """(checkpoint id, partition, path) of the parts sealed at a barrier and not
        published, in order."""
        parts = []
        for path in self.tmp_dir.rglob(f"{self.layout.key}.ckpt-*.{self.layout.ext}"):
            number = int(path.name.split(".ckpt-")[1].split(".")[0])
            partition = path.parent.relative_to(self.tmp_dir).as_posix()
            parts.append((number, "" if partition == "." else partition, path))
        return sorted(parts)

    def _publish_upto(self, checkpoint_id: int) -> None:
        for number, partition, pending in self._pending_parts():
            if number <= checkpoint_id:
                os.replace(pending, self.layout.target(partition, f"-{number:012d}"))

    def prepare_commit(self, checkpoint_id: int) -> dict:
        for part in self.parts.values():
            part.close()
            name = f"{self.layout.key}.ckpt-{checkpoint_id}.{self.layout.ext}"
            os.replace(part.path, part.path.parent / name)
        self.parts.clear()
        if not self.layout.partition_by:
            self.part("")
        return {"checkpoint": checkpoint_id}

    def commit(self, state: dict) -> None:
        """Checkpoint N completed: publish its parts and every earlier one still pending (a
        rename each, so committing twice changes nothing)."""
        self._publish_upto(state["checkpoint"])

    def close(self) -> None:
        """The reader ended. Checkpointed, it did so after committing its final checkpoint, so
        what is left (parts of later barriers, rows since) is empty: published as before."""
        self._publish_upto(2**62)
        for partition, part in self.parts.items():
            part.close()
            os.replace(part.path, self.layout.target(partition, "-end"))
        self.parts.clear()


# -- batches encoded as the row path writes them, a column at a time ------------------------------


def encode(batch: pa.RecordBatch, schema: Schema, config: dict) -> pa.Table | str:
    """A table for pyarrow's writers, or text; Unsupported where rows would write otherwise."""
    fmt, row = config["file_format_type"], text_delimiter(config.get("row_delimiter") or "\n")
    columns = list(zip(batch.columns, schema.fields, strict=True))
    if fmt in ("parquet", "orc"):
        for c, (_, k) in columns:  # the rows write a map with each key once
            inner = k.count("map<") - k.startswith("map<")  # maps inside another type
            if inner or (k.startswith("map<") and has_repeated_keys(c)):
                raise Unsupported("a map that may repeat a key")
        # pyarrow's ORC writer misplaces the members of a sliced struct: a copy is not sliced
        arrays = [pa.concat_arrays([c]) if fmt == "orc" else c for c in batch.columns]
        return pa.Table.from_arrays(arrays, schema=arrow_schema(schema))
    if fmt not in ("json", "csv", "text"):
        raise Unsupported(f"{fmt} parts are written from rows")
    if fmt == "json":
        return joined(_concat("{", _json_object(columns), "}\n")).decode()
    delimiter = text_delimiter(config["field_delimiter"])
    texts = [pc.fill_null(py_text(c, k, decoded=fmt == "text"), "") for c, (_, k) in columns]
    texts = _csv_fields(texts, delimiter, row) if fmt == "csv" else texts
    return joined(_concat(pc.binary_join_element_wise(*texts, delimiter), row)).decode()


def _concat(*parts) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _csv_fields(texts: list[pa.Array], delimiter: str, row: str) -> list[pa.Array]:
    """Quoted as Python's csv writer does: a delimiter, quote or line end inside, a lone ""."""
    special = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in {delimiter, '"', *row}) + "]"
    quoted = [_concat('"', pc.replace_substring(t, '"', '""'), '"') for t in texts]
    needs = [pc.match_substring_regex(t, special) for t in texts]
    out = list(map(pc.if_else, needs, quoted, texts))
    return [pc.if_else(pc.equal(out[0], ""), '""', out[0])] if len(out) == 1 else out


def py_text(column: pa.Array, kind: str, decoded: bool = False) -> pa.Array:
    """``str()`` of each value of the row model, nulls kept; bytes ``decoded`` or Unsupported."""
    kinds = family(kind)
    if kinds in ("integer", "string", "decimal", "date", "null", "bytes" if decoded else ""):
        return column.cast(pa.string())  # a decimal as Python's str(Decimal); bad UTF-8 fails
    if kinds in ("number", "boolean"):
        return float_text(column) if kinds == "number" else pc.if_else(column, "True", "False")
    if kinds not in ("time", "timestamp"):
        raise Unsupported(f"{kind} as text")
    text = pc.replace_substring(column.cast(pa.string()), " ", "T", max_replacements=1)
    return pc.replace_substring_regex(text, r"\.000000$", "")


#: Python's notation for the same shortest digits: exponents of 2 digits, below 1e-4, not to 1e16.
REPR = [(r"e-([0-9])$", r"e-0\1")]
REPR += [(rf"^(-?)0\.{'0' * z}([1-9])([0-9]*)$", rf"\1\2.\3e-0{z + 1}") for z in (5, 4)]
REPR += [(r"\.e", "e")]
REPR += [(rf"^(-?)([1-9])\.([0-9]{{{p}}})([0-9]+)e\+{p}$", r"\1\2\3.\4") for p in range(10, 16)]


def float_text(column: pa.Array) -> pa.Array:
    """``repr()`` of each value, from pyarrow's shortest round-trip digits."""
    x = column.cast(pa.float64())
    text = pc.cast(x, pa.string())
    whole = pc.and_(pc.equal(pc.floor(x), x), pc.less(pc.abs(x), 1e16))  # "1700000000000.0"
    digits = pc.if_else(whole, x, 0).cast(pa.int64()).cast(pa.string())
    text = pc.if_else(whole, _concat(pc.if_else(pc.equal(x, 0), text, digits), ".0"), text)
    same = r"^-?([1-9][0-9]*\.[0-9]+|0\.0{0,3}[1-9][0-9]*|0\.0)$"
    odd = pc.invert(pc.match_substring_regex(text, same))
    if not pc.any(odd).as_py():
        return text
    fixed = text.filter(odd)
    for pattern, replacement in REPR:
        fixed = pc.replace_substring_regex(fixed, pattern, replacement)
    return pc.replace_with_mask(text, odd, fixed)


#: How json.dumps (ensure_ascii) escapes the characters it writes as two.
JSON_ESCAPES = [(c, json.dumps(c)[1:-1]) for c in '\\"\n\r\t\x08\x0c']


def json_text(column: pa.Array, kind: str) -> pa.Array:
    """Each value as json.dumps writes its ``jsonable`` value ("null" for null)."""
    kinds = family(kind)
    if kinds in ("boolean", "integer", "number"):
        text = pc.if_else(column, "true", "false") if kinds == "boolean" else py_text(column, kind)
        text = pc.replace_substring(pc.replace_substring(text, "nan", "NaN"), "inf", "Infinity")
    elif kinds == "row":
        text = _concat("{", _json_object([(column.field(f[0]), f) for f in row_fields(kind)]), "}")
    elif kinds in ("array", "map"):
        text = _json_members(column, kind)
    else:
        text = json_string(py_text(column, kind, decoded=True))
    return pc.if_else(column.is_null(), "null", text)


def _json_object(columns: list[tuple[pa.Array, tuple[str, str]]]) -> pa.Array:
    """``"name": value, ...`` of each row of the columns (each with its field)."""
    members = [_concat(f"{json.dumps(n)}: ", json_text(c, k)) for c, (n, k) in columns]
    return pc.binary_join_element_wise(*members, ", ")


def _json_members(column: pa.Array, kind: str) -> pa.Array:
    """An array as ``[a, b]``, a map as ``{"k": v}``."""
    base, args = kind_args(kind)
    column = pa.concat_arrays([column])  # not sliced: its offsets index its members
    if base == "map" and has_repeated_keys(column):
        raise Unsupported("a map repeating a key, which the row path keeps once")
    if base == "array":
        members = json_text(column.values, args[0])
    else:
        key = json_string(py_text(column.keys, args[0]))
        members = _concat(key, ": ", json_text(column.items, args[1]))
    inner = pc.binary_join(pa.ListArray.from_arrays(column.offsets, members), ", ")
    return _concat("[", inner, "]") if base == "array" else _concat("{", inner, "}")


def json_string(text: pa.Array) -> pa.Array:
    """Text as json.dumps quotes it; Unsupported where it writes ``\\uXXXX`` (non-ASCII...)."""
    if pc.any(pc.match_substring_regex(text, r"[^\x20-\x7e\t\n\r\x08\x0c]")).as_py():
        raise Unsupported("characters that json.dumps writes as \\u escapes")
    for char, escape in JSON_ESCAPES:
        text = pc.replace_substring(text, char, escape)
    return _concat('"', text, '"')


@register
class LocalFileSink(LocalFile, SinkPlugin):
    options = (
        Option("path", str, required=True, help="the directory that receives the parts"),
        FILE_FORMAT,
        FIELD_DELIMITER,
        ROW_DELIMITER,
        Option("header", bool, default=False, help="write a header row (text, csv, excel)"),
        Option("custom_filename", bool, default=False, help="name parts by the expression"),
        Option("file_name_expression", str, default="${transactionId}"),
        Option("filename_time_format", str, default="yyyy.MM.dd", help="of ${now}"),
        Option("sink_columns", list, help="the fields written, in this order (default: all)"),
        Option("have_partition", bool, default=False, help="write partition directories"),
        Option("partition_by", list, default=[], help="the fields that name the directories"),
        Option("partition_dir_expression", str, help="default ${k0}=${v0}/${k1}=${v1}/..."),
        Option("is_partition_field_write_in_file", bool, default=False),
        COMPRESS,
        ENCODING,
        SHEET,
        *filesavemodes.OPTIONS,
    )
    aliases = LocalFile.aliases | {"enable_header_write": "header"}
    ignored_options = SINK_IGNORED

    @classmethod
    def check(cls, config):
        errors = cls.check_format(config)
        try:
            path = within_roots(config)
        except Refused as exc:
            return [*errors, ("path", str(exc))]
        if path.exists() and not path.is_dir():
            errors.append(("path", f"{path} exists and is not a directory"))
        if config.get("have_partition") and not config.get("partition_by"):
            errors.append(("partition_by", "have_partition = true needs the fields to split by"))
        for option in ("sink_columns", "partition_by"):
            if any(not isinstance(v, str) for v in config[option] or []):
                errors.append((option, "must be a list of field names"))
        name = config.get("file_name_expression") or ""
        if any(c in name for c in "/\\") or name.strip(".") == "":
            errors.append(("file_name_expression", "must be a file name (no / or \\)"))
        directories = (config.get("partition_dir_expression") or "").replace("\\", "/")
        if directories.startswith("/") or ".." in directories.split("/"):
            errors.append(("partition_dir_expression", "must stay inside path (no .., not /...)"))
        return errors + filesavemodes.check(config)

    @classmethod
    def notes(cls, config):
        return filesavemodes.warnings(config)

    def save_modes_due(self) -> bool:
        """Whether its save modes change or check the directory before the job's first row."""
        return filesavemodes.due(self.config)

    def apply_save_modes(self) -> list[str]:
        """Once per job, before its first row (engine.member.savemodes): what was done."""
        return filesavemodes.apply(self.config, self.path)

    def input_errors(self, schema: Schema) -> list[tuple[str, str]]:
        """Checked when the job is planned, against the schema the sink receives."""
        errors = []
        for option in ("sink_columns", "partition_by"):
            unknown = [c for c in self.config[option] or [] if c not in schema.names]
            if unknown:
                errors.append((option, f"not in the sink's input: {', '.join(unknown)}"))
        if self.config["file_format_type"] == "binary" and schema.names[:2] != [
            "data",
            "relativePath",
        ]:
            errors.append(("file_format_type", "binary takes the rows of a binary source"))
        return errors

    def writer(self, schema: Schema, context: dict) -> SinkWriter:
        if context.get("checkpointing"):
            return CheckpointedLocalFileWriter(self.config, schema, context)
        return LocalFileWriter(self.config, schema, context)
