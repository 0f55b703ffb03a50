"""LocalFile source and sink: CSV or JSON lines on the local file system.

The sink writes each reader's rows to a hidden temporary part and publishes it with an atomic
rename when the task group finishes; a cancelled or failed attempt publishes nothing, so a
restarted pipeline never leaves duplicates behind.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from engine.connectors.base import Option, SinkPlugin, SinkWriter, SourcePlugin
from engine.connectors.boundaries import Refused, resolve_file_path
from engine.connectors.registry import register
from engine.connectors.schema import Schema, parse_schema

FORMATS = ("csv", "json")
#: The options of the source and the sink alike.
FILE_FORMAT = Option("file_format_type", str, default="csv", choices=FORMATS)
FIELD_DELIMITER = Option("field_delimiter", str, default=",")
TMP_DIR = ".keel-tmp"


def _convert(kind: str, value):
    if value is None or value == "":
        return None
    if kind in ("int", "bigint"):
        return int(value)
    if kind in ("double", "float", "decimal"):
        return float(value)
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        return str(value).strip().lower() in ("true", "1", "t", "yes")
    return str(value)


class LocalFile:
    """The name of the LocalFile source and sink."""

    name = "LocalFile"


def within_roots(config: dict) -> Path:
    """The configured path, resolved, if it lies inside a file root (Refused otherwise). The
    plan keeps the resolved path, and the worker checks it again before it opens anything."""
    resolved = resolve_file_path(config["path"])
    config["path"] = str(resolved)
    return resolved


@register
class LocalFileSource(LocalFile, SourcePlugin):
    options = (
        Option("path", str, required=True, help="a file, or a directory of files"),
        FILE_FORMAT,
        Option("schema", dict, required=True, help="schema { fields { name = type } }"),
        FIELD_DELIMITER,
        Option("skip_header_rows", int, default=0, min=0),
    )
    aliases = {"skip_header_row_number": "skip_header_rows"}

    @classmethod
    def check(cls, config):
        _, errors = parse_schema(config["schema"])
        try:
            path = within_roots(config)
        except Refused as exc:
            return [*errors, ("path", str(exc))]
        if not path.exists():
            errors.append(("path", f"no such file or directory: {path}"))
        elif path.is_dir() and not any(p.is_file() for p in path.iterdir()):
            errors.append(("path", f"the directory {path} holds no files"))
        if len(config["field_delimiter"]) != 1:
            errors.append(("field_delimiter", "must be one character"))
        return errors

    def output_schema(self) -> Schema:
        return parse_schema(self.config["schema"])[0]

    def files(self) -> list[Path]:
        path = resolve_file_path(self.config["path"])
        if path.is_file():
            return [path]
        return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))

    def create_splits(self, mode: str) -> list[dict]:
        return [{"splitId": f"file-{i}", "path": str(p)} for i, p in enumerate(self.files())]

    def read(self, split: dict, offset: int, mode: str, batch_size: int):
        """Records of the file from ``offset`` (records, not lines: blank lines are skipped and
        a quoted CSV field may span lines). A record of the wrong width fails the task."""
        schema = self.output_schema()
        kinds = [kind for _, kind in schema.fields]
        names = schema.names
        width = len(kinds)
        with open(split["path"], newline="", encoding="utf-8") as fh:
            if self.config["file_format_type"] == "csv":
                reader = csv.reader(fh, delimiter=self.config["field_delimiter"])
                records = (r for r in reader if r)
            else:
                records = (json.loads(line) for line in fh if line.strip())
            for _ in range(self.config["skip_header_rows"]):
                if next(records, None) is None:
                    return
            batch = []
            for number, record in enumerate(records):
                if number < offset:
                    continue
                if isinstance(record, list):
                    if len(record) != width:
                        raise ValueError(
                            f"{split['path']}: record {number + 1} has "
                            f"{len(record)} fields, the schema {width}"
                        )
                    row = tuple(_convert(k, v) for k, v in zip(kinds, record, strict=True))
                elif isinstance(record, dict):
                    row = tuple(
                        _convert(k, record.get(n)) for k, n in zip(kinds, names, strict=True)
                    )
                else:
                    raise ValueError(f"{split['path']}: record {number + 1} is not an object")
                batch.append(row)
                if len(batch) >= batch_size:
                    offset += len(batch)
                    yield batch, offset
                    batch = []
            if batch:
                offset += len(batch)
                yield batch, offset


class LocalFileWriter(SinkWriter):
    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        self.directory = resolve_file_path(config["path"])
        self.format = config["file_format_type"]
        self.delimiter = config["field_delimiter"]
        self.names = schema.names
        ext = "csv" if self.format == "csv" else "jsonl"
        part = (
            f"part-{context.get('jobId', 0)}-{context.get('pipelineId', 0)}"
            f"-{context.get('readerIndex', 0)}"
        )
        self.final = self.directory / f"{part}.{ext}"
        tmp_dir = self.directory / TMP_DIR
        tmp_dir.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp_dir / f"{part}.attempt-{context.get('attempt', 0)}.{ext}"
        self.fh = open(self.tmp, "w", newline="", encoding="utf-8")
        self.csv = csv.writer(self.fh, delimiter=self.delimiter) if self.format == "csv" else None
        if self.csv is not None and config["header"]:
            self.csv.writerow(self.names)

    def write(self, rows: list[tuple]) -> None:
        if self.csv is not None:
            self.csv.writerows(rows)
        else:
            buf = io.StringIO()
            for row in rows:
                buf.write(json.dumps(dict(zip(self.names, row, strict=True)), default=str))
                buf.write("\n")
            self.fh.write(buf.getvalue())

    def close(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.tmp, self.final)  # publish atomically

    def abort(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


class CheckpointedLocalFileWriter(LocalFileWriter):
    """A part per checkpoint: barrier N seals the rows written since N-1 into a pending part;
    completion of N publishes it (a rename, so committing twice changes nothing). A new attempt
    publishes the pending parts of the checkpoint it restores from and earlier, and discards the
    rest: those rows are replayed from the checkpoint's offsets."""

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        self.config = config
        self.schema = schema
        self.context = context
        self.ext = "csv" if config["file_format_type"] == "csv" else "jsonl"
        self.key = (
            f"part-{context.get('jobId', 0)}-{context.get('pipelineId', 0)}"
            f"-{context.get('readerIndex', 0)}"
        )
        directory = resolve_file_path(config["path"])
        self.tmp_dir = directory / TMP_DIR
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        restored = context.get("restoredCheckpoint")
        self._publish_upto(restored if restored is not None else -1)
        for _, pending in self._pending_parts():
            pending.unlink()
        for stale in self.tmp_dir.glob(f"{self.key}.attempt-*"):
            stale.unlink()
        self.sealed = 0
        self._open()

    def _pending_parts(self) -> list[tuple[int, Path]]:
        """(checkpoint id, path) of the parts sealed at a barrier and not published, in order."""
        parts = [
            (int(path.name.split(".ckpt-")[1].split(".")[0]), path)
            for path in self.tmp_dir.glob(f"{self.key}.ckpt-*.{self.ext}")
        ]
        return sorted(parts)

    def _publish_upto(self, checkpoint_id: int) -> None:
        for number, pending in self._pending_parts():
            if number <= checkpoint_id:
                os.replace(pending, self.published(number))

    def published(self, checkpoint_id: int) -> Path:
        return Path(self.config["path"]) / f"{self.key}-{checkpoint_id:012d}.{self.ext}"

    def pending(self, checkpoint_id: int) -> Path:
        return self.tmp_dir / f"{self.key}.ckpt-{checkpoint_id}.{self.ext}"

    def _open(self) -> None:
        self.sealed += 1
        self.tmp = self.tmp_dir / (
            f"{self.key}.attempt-{self.context.get('attempt', 0)}-{self.sealed}.{self.ext}"
        )
        self.fh = open(self.tmp, "w", newline="", encoding="utf-8")
        self.delimiter = self.config["field_delimiter"]
        self.format = self.config["file_format_type"]
        self.names = self.schema.names
        self.csv = csv.writer(self.fh, delimiter=self.delimiter) if self.format == "csv" else None
        if self.csv is not None and self.config["header"]:
            self.csv.writerow(self.names)

    def _seal(self) -> Path:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        return self.tmp

    def prepare_commit(self, checkpoint_id: int) -> dict:
        os.replace(self._seal(), self.pending(checkpoint_id))
        self._open()
        return {"checkpoint": checkpoint_id}

    def commit(self, state: dict) -> None:
        """Checkpoint N completed: publish its part and every earlier one still pending (a
        rename each, so committing twice changes nothing)."""
        self._publish_upto(state["checkpoint"])

    def close(self) -> None:
        """The reader ended. Checkpointed, it did so after committing its final checkpoint, so
        what is left (parts of later barriers, rows since) is empty: published as before."""
        self._publish_upto(2**62)
        os.replace(self._seal(), Path(self.config["path"]) / f"{self.key}-end.{self.ext}")

    def abort(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


@register
class LocalFileSink(LocalFile, SinkPlugin):
    options = (
        Option("path", str, required=True, help="the directory that receives the parts"),
        FILE_FORMAT,
        FIELD_DELIMITER,
        Option("header", bool, default=False, help="write a header row (csv)"),
    )
    ignored_options = {
        "is_enable_transaction": "each part is always published atomically, when its "
        "checkpoint (or its reader) completes",
    }

    @classmethod
    def check(cls, config):
        try:
            path = within_roots(config)
        except Refused as exc:
            return [("path", str(exc))]
        if path.exists() and not path.is_dir():
            return [("path", f"{path} exists and is not a directory")]
        if len(config["field_delimiter"]) != 1:
            return [("field_delimiter", "must be one character")]
        return []

    def writer(self, schema: Schema, context: dict) -> SinkWriter:
        if context.get("checkpointing"):
            return CheckpointedLocalFileWriter(self.config, schema, context)
        return LocalFileWriter(self.config, schema, context)
