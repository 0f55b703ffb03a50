"""LocalFile sink: each reader's rows go to hidden temporary parts (one per partition
directory), published with an atomic rename when the task group finishes or, checkpointed, when
the checkpoint that sealed them completes; a cancelled or failed attempt publishes nothing, so a
restarted pipeline never leaves duplicates behind."""

from __future__ import annotations

import os
import uuid
from datetime import datetime
from pathlib import Path

from engine.connectors.base import Option, SinkPlugin, SinkWriter
from engine.connectors.boundaries import Refused, resolve_file_path
from engine.connectors.fileformats import SUFFIX, PartFile, open_part
from engine.connectors.localfile import (
    COMMON_IGNORED,
    COMPRESS,
    ENCODING,
    FIELD_DELIMITER,
    FILE_FORMAT,
    HIVE_NULL,
    ROW_DELIMITER,
    SHEET,
    TMP_DIR,
    LocalFile,
    within_roots,
)
from engine.connectors.registry import register
from engine.connectors.schema import Schema


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
        label = str(context.get("label", ""))
        if label.startswith("sink[") and not label.startswith("sink[0]"):
            # A second sink of the pipeline may write the same directory: its own parts.
            self.key += f"-k{label[5 : label.index(']')]}"
        columns = config.get("sink_columns") or schema.names
        self.partition_by = config.get("partition_by") if config.get("have_partition") else []
        if self.partition_by and not config.get("is_partition_field_write_in_file"):
            columns = [c for c in columns if c not in self.partition_by]
        self.schema = schema.project(columns)
        self.picks = [schema.index(c) for c in columns]
        self.partition_picks = [schema.index(c) for c in self.partition_by]

    def split(self, rows: list[tuple]) -> dict[str, list[tuple]]:
        """Rows by partition directory ("" without partitions), projected to the columns."""
        picks = self.picks
        if not self.partition_picks:
            return {"": [tuple(row[i] for i in picks) for row in rows]}
        out: dict[str, list[tuple]] = {}
        for row in rows:
            out.setdefault(self.partition_dir(row), []).append(tuple(row[i] for i in picks))
        return out

    def partition_dir(self, row: tuple) -> str:
        expression = self.config.get("partition_dir_expression")
        values = [partition_value(row[i]) for i in self.partition_picks]
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
    )
    aliases = LocalFile.aliases | {"enable_header_write": "header"}
    ignored_options = COMMON_IGNORED | {
        "is_enable_transaction": "each part is always published atomically, when its "
        "checkpoint (or its reader) completes",
        "tmp_path": f"parts are staged in {TMP_DIR} under the sink's path (one file system: "
        "publishing is a rename)",
        "batch_size": "a part holds what its reader wrote until its checkpoint",
        "single_file_mode": "each reader writes its own parts (Keel never merges them)",
        "create_empty_file_when_no_data": "an unpartitioned sink always publishes its part",
        "max_rows_in_memory": "Excel parts are streamed to disk",
        "csv_string_quote_mode": "csv quotes only where a value needs it",
        "schema_save_mode": "the directory is created when missing",
        "data_save_mode": "parts are added beside what the directory holds",
    }

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
        return errors

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
