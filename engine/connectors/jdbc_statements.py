"""The Jdbc sink's statements: how incoming fields name target columns, a custom query's
placeholders and stage, and the statement that moves a stage into its target."""

from __future__ import annotations

import json
import re

from psycopg import sql

from engine.connectors.schema import Schema, jsonable, kind_args


def _insert_from(
    table: sql.Composable,
    cols: sql.Composable,
    source: sql.Composable,
    where: sql.Composable,
    order: sql.Composable,
    columns: list[str],
    keys: list[str],
    casts: dict[str, str] | None = None,
) -> sql.Composed:
    """INSERT INTO table SELECT ... FROM source: an upsert on ``keys`` (the last row of a key
    wins), or a plain insert without keys. ``casts``: {column: the target's type} for stage
    columns held as text (engine.connectors.jdbc_ingest)."""

    def value(c: str) -> sql.Composable:
        if casts and c in casts:
            return sql.SQL("{c}::{t}").format(c=sql.Identifier(c), t=sql.SQL(casts[c]))
        return sql.Identifier(c)

    picked = sql.SQL(", ").join(value(c) for c in columns) if casts else cols
    if not keys:
        return sql.SQL("INSERT INTO {t} ({cols}) SELECT {picked} FROM {s} WHERE {w}").format(
            t=table, cols=cols, picked=picked, s=source, w=where
        )
    key_list = sql.SQL(", ").join(sql.Identifier(k) for k in keys)
    key_values = sql.SQL(", ").join(value(k) for k in keys)
    query = sql.SQL(
        "INSERT INTO {t} ({cols}) SELECT DISTINCT ON ({kv}) {picked} FROM {s} WHERE {w} "
        "ORDER BY {kv}, {o} DESC ON CONFLICT ({keys}) "
    ).format(
        t=table, cols=cols, kv=key_values, picked=picked, keys=key_list, s=source, w=where, o=order
    )
    updates = [c for c in columns if c not in keys]
    if not updates:
        return query + sql.SQL("DO NOTHING")
    return (
        query
        + sql.SQL("DO UPDATE SET ")
        + sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in updates
        )
    )


def text_casts(
    columns: list[str],
    stage_types: dict[str, tuple[str, str]],
    target_types: dict[str, tuple[str, str]],
) -> dict[str, str]:
    """{column: the target's type, without its modifiers} for the stage columns held as text
    that the target holds as another type. The cast parses the text; the insert's own
    assignment then checks the modifiers (a length, a precision) and fails rather than
    truncate, as the explicit ``::varchar(3)`` would."""
    return {
        c: unmodified(target_types[c][0])
        for c in columns
        if stage_types[c][0] == "text" and target_types.get(c, ("text",))[0] != "text"
    }


def write_checks(casts: dict[str, str], target_types: dict[str, tuple[str, str]]) -> dict:
    """{column: the type its staged text is parsed as when written}: the commit's cast, or
    for a numeric with a precision the full type, whose explicit cast fails on an overflow as
    the commit's assignment would (a too-long string fails binary COPY into the stage)."""
    return {
        column: target_types[column][1] if target_types[column][0] == "numeric" else cast
        for column, cast in casts.items()
    }


def unmodified(base: str) -> str:
    """A type without modifiers as a cast takes it: ``character`` alone means ``char(1)`` and
    ``bit`` means ``bit(1)``, so those are cast to ``bpchar`` and ``varbit``."""
    name, brackets, rest = base.partition("[")
    name = {"character": "bpchar", "bit": "varbit"}.get(name, name)
    return name + brackets + rest


#: ``field_ide``: how incoming field names become the table's column names.
FIELD_IDE = {"ORIGINAL": str, "UPPERCASE": str.upper, "LOWERCASE": str.lower}
#: A custom sink ``query`` is one statement that changes rows.
QUERY_STATEMENT = re.compile(r"^\s*(insert|update|delete|merge)\b", re.IGNORECASE)
_QUOTED_OR_MARK = re.compile(r"'(?:[^']|'')*'|\?|%")
#: A custom query's staging columns, by field type (complex values are staged as JSON text).
STAGE_TYPES = {
    "tinyint": "smallint",
    "smallint": "smallint",
    "int": "integer",
    "bigint": "bigint",
    "float": "real",
    "double": "double precision",
    "decimal": "numeric",
    "boolean": "boolean",
    "bytes": "bytea",
    "date": "date",
    "time": "time",
    "timestamp": "timestamptz",
}


def target_columns(config: dict, schema: Schema) -> list[str]:
    return [FIELD_IDE[config.get("field_ide") or "ORIGINAL"](n) for n in schema.names]


def upsert_keys(config: dict) -> list[str]:
    return (config.get("primary_keys") or []) if config.get("enable_upsert", True) else []


def placeholders(query: str) -> int:
    """The ``?`` of a custom query, outside its string literals."""
    return sum(1 for m in _QUOTED_OR_MARK.finditer(query) if m.group() == "?")


def custom_statement(query: str) -> str:
    """SeaTunnel's JDBC placeholders (``?``) as psycopg's; literal ``%`` kept."""
    marks = {"?": "%s", "%": "%%"}
    return _QUOTED_OR_MARK.sub(lambda m: marks.get(m.group(), m.group()), query.strip().rstrip(";"))


def staged(schema: Schema, target_types: list[str] | None = None):
    """A function that makes a row fit the staging table or the target's columns
    (``target_types``, without modifiers, in the fields' order): nested values as JSON text,
    but an array into an array column as a list (written as an array)."""
    as_lists = [t.endswith("]") for t in target_types or [""] * len(schema.kinds)]
    complex_at = [
        (i, kind)
        for i, kind in enumerate(schema.kinds)
        if kind_args(kind)[0] not in STAGE_TYPES
        and kind not in ("string", "null")
        and not (as_lists[i] and kind_args(kind)[0] == "array")
    ]
    if not complex_at:
        return lambda row: row

    def fit(row: tuple) -> tuple:
        out = list(row)
        for i, kind in complex_at:
            if out[i] is not None:
                out[i] = json.dumps(jsonable(kind, out[i]))
        return tuple(out)

    return fit


def psycopg_string(composable: sql.Composable) -> str:
    """A statement as text (no parameters: every value in it is a literal)."""
    return composable.as_string(None)


def regclass(table: sql.Identifier) -> str:
    """A table's quoted name as a literal (for ``::regclass``)."""
    return psycopg_string(sql.Literal(psycopg_string(table)))
