"""The columns a LocalFile file names, for a managed reader's schema changes.

With ``schema-changes.enabled``, a managed LocalFile reader looks at each file's columns before
it emits any of its records: columns the schema in effect does not have are a schema change
(columns added at the end, in the file's order). Formats whose files name their columns are
looked at: Parquet and ORC (typed as the file types them), JSON lines (the first record's keys,
typed from its values) and CSV read by its header line (strings). Text, CSV without a header,
Excel and binary files name no columns: they never start one. A column the file lacks is read
as null, as before; a column whose type changed is converted as before (or fails the read).
"""

from __future__ import annotations

import csv
import itertools
import json
from collections import Counter
from pathlib import Path

from engine.connectors.fileformats import _open_text, arrow_schema_of, text_delimiter

#: The option that turns schema changes on (a source option, as SeaTunnel's CDC sources name it).
OPTION = "schema-changes.enabled"
#: The most columns one file may add, and the most a schema may reach: a file's names are
#: untrusted input that becomes table columns (PostgreSQL allows 1,600 a table).
MAX_ADDED, MAX_COLUMNS = 100, 1000
#: The longest column name (PostgreSQL cuts longer ones at 63 bytes, so two could collide).
MAX_NAME = 63


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double"
    return "string"  # text, and what JSON nests (read as its text)


def file_columns(path: Path, config: dict) -> list[tuple[str, str]] | None:
    """The file's columns as (name, kind), in its order; None when its format names none."""
    fmt = config["file_format_type"]
    if fmt in ("parquet", "orc"):
        return list(arrow_schema_of(path, fmt).fields)
    if fmt == "json":
        with _open_text(path, config) as text:
            for line in text:
                if line.strip():
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        return None
                    return [(str(k), _json_kind(v)) for k, v in record.items()]
        return None
    if fmt == "csv" and config.get("csv_use_header_line"):
        with _open_text(path, config) as text:
            rows = csv.reader(
                text,
                delimiter=text_delimiter(config.get("field_delimiter") or ","),
                quotechar=config.get("quote_char") or '"',
            )
            header = next(itertools.islice(rows, config.get("skip_header_rows") or 0, None), None)
        return None if header is None else [(name, "string") for name in header]
    return None


def added_columns(
    path: Path, config: dict, schema: list[tuple[str, str]], partition: dict
) -> list[tuple[str, str]]:
    """The file's columns that ``schema`` lacks (and its path's partition does not fill)."""
    if config.get("read_columns"):
        return []  # the columns read are named: a file's others are not read
    columns = file_columns(path, config)
    if not columns:
        return []
    if len(columns) > MAX_COLUMNS:
        raise ValueError(f"it names {len(columns)} columns: at most {MAX_COLUMNS} are read")
    names = [name for name, _ in columns]
    bad = [n for n in names if not n.strip() or len(n.encode()) > MAX_NAME or not n.isprintable()]
    if bad:
        raise ValueError(
            f"column name {bad[0][:80]!r}: names are 1 to {MAX_NAME} bytes of printable text"
        )
    twice = sorted(name for name, n in Counter(names).items() if n > 1)
    if twice:
        raise ValueError(f"it names column(s) {', '.join(twice)} more than once")
    known = {name for name, _ in schema} | set(partition)
    added = [(name, kind) for name, kind in columns if name not in known]
    if len(added) > MAX_ADDED or len(schema) + len(added) > MAX_COLUMNS:
        raise ValueError(
            f"it adds {len(added)} columns to {len(schema)}: a schema change adds at most "
            f"{MAX_ADDED}, up to {MAX_COLUMNS} in all"
        )
    return added
