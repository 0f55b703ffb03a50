"""The Jdbc sink's save modes: what a job does to its target table once, before its first row
(docs/decisions/0034-save-modes.md says when and how often that runs).

``schema_save_mode``: CREATE_SCHEMA_WHEN_NOT_EXIST (SeaTunnel's default: the table is created
from the incoming fields, keyed on ``primary_keys``), RECREATE_SCHEMA (dropped and created),
ERROR_WHEN_SCHEMA_NOT_EXIST, IGNORE. ``data_save_mode``: APPEND_DATA (the default),
DROP_DATA (emptied), ERROR_WHEN_DATA_EXISTS, CUSTOM_PROCESSING (``custom_sql`` runs). On
PostgreSQL both run in one transaction of the target: a step killed half-way changed nothing
(MySQL commits each DDL statement itself: each step there is idempotent instead).
"""

from __future__ import annotations

from typing import Protocol

import psycopg
from psycopg import sql

from engine.connectors.base import Option
from engine.connectors.jdbc_statements import STAGE_TYPES, target_columns
from engine.connectors.pg import connect, table_columns, table_ident
from engine.connectors.schema import Schema, kind_args

SCHEMA_SAVE_MODES = (
    "CREATE_SCHEMA_WHEN_NOT_EXIST",
    "RECREATE_SCHEMA",
    "ERROR_WHEN_SCHEMA_NOT_EXIST",
    "IGNORE",
)
DATA_SAVE_MODES = ("APPEND_DATA", "DROP_DATA", "ERROR_WHEN_DATA_EXISTS", "CUSTOM_PROCESSING")
SAVE_MODE_OPTIONS = (
    Option("schema_save_mode", str, default=SCHEMA_SAVE_MODES[0], choices=SCHEMA_SAVE_MODES),
    Option("data_save_mode", str, default=DATA_SAVE_MODES[0], choices=DATA_SAVE_MODES),
    Option("custom_sql", str, default="", help="run before the first row (CUSTOM_PROCESSING)"),
)
#: A created table's column type, by the incoming field's kind: a custom query's staging types,
#: but a timestamp without a zone, as it comes; an array of scalars is an array of their type
#: (as SeaTunnel creates it), maps, rows and other arrays are JSON (jsonb).
COLUMN_TYPES = STAGE_TYPES | {"string": "text", "timestamp": "timestamp", "null": "text"}


class SaveModeError(Exception):
    """A save mode that refuses the target as it is (ERROR_WHEN_...)."""


def save_mode_errors(config: dict, exists: bool) -> list[tuple[str, str]]:
    """The save modes' checks when the job is planned: ``exists`` says whether the table
    does."""
    schema_mode, data_mode = config["schema_save_mode"], config["data_save_mode"]
    if data_mode == "CUSTOM_PROCESSING" and not config["custom_sql"].strip():
        return [("custom_sql", "is required with data_save_mode = CUSTOM_PROCESSING")]
    if not config["table"]:  # a custom query: only CUSTOM_PROCESSING has a meaning
        if schema_mode not in ("CREATE_SCHEMA_WHEN_NOT_EXIST", "IGNORE"):
            return [("schema_save_mode", f"{schema_mode} needs a table (not query)")]
        if data_mode not in ("APPEND_DATA", "CUSTOM_PROCESSING"):
            return [("data_save_mode", f"{data_mode} needs a table (not query)")]
        return []
    if not exists and schema_mode in ("ERROR_WHEN_SCHEMA_NOT_EXIST", "IGNORE"):
        return [("table", f"no table {config['table']!r} in that database ({schema_mode})")]
    return []


def creates_table(config: dict, exists: bool) -> bool:
    """Whether the save mode makes the table from the incoming fields (so its columns are not
    checked against them when planning)."""
    mode = config.get("schema_save_mode")
    return bool(config.get("table")) and (
        mode == "RECREATE_SCHEMA" or (mode == "CREATE_SCHEMA_WHEN_NOT_EXIST" and not exists)
    )


def save_modes_due(config: dict) -> bool:
    """Whether the save modes may change or check the target (every mode but IGNORE with
    APPEND_DATA, and a custom query's APPEND_DATA, changes nothing). A sink planned before
    save modes existed has none."""
    if "data_save_mode" not in config:
        return False
    if config["data_save_mode"] != "APPEND_DATA":
        return True
    return bool(config.get("table")) and config["schema_save_mode"] != "IGNORE"


def add_columns(config: dict, added: list[tuple[str, str]]) -> None:
    """The PostgreSQL table takes columns ``added``, in one transaction. The lock it needs
    waits at most 200 ms: another writer's open transaction on the table holds it off,
    and the schema change tries again at its reader's next step (``SchemaChangePending``)
    rather than queue every writer of the table behind it."""
    from engine.sourceruntime.schema_change import SchemaChangePending

    table = table_ident(config["table"])
    names = target_columns(config, Schema(tuple(added)))
    options = "-c lock_timeout=200 -c statement_timeout=30000"
    try:
        with connect(config, "keel-schema-change", options=options) as conn:
            for name, (_, kind) in zip(names, added, strict=True):
                conn.execute(
                    sql.SQL("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {c} {k}").format(
                        t=table, c=sql.Identifier(name), k=sql.SQL(column_type(kind))
                    )
                )
            conn.commit()
    except psycopg.errors.LockNotAvailable as exc:
        raise SchemaChangePending(str(exc)) from exc


def column_type(kind: str) -> str:
    base, args = kind_args(kind)
    if base == "array" and kind_args(args[0])[0] in COLUMN_TYPES and args[0] != "null":
        return column_type(args[0]) + "[]"
    if base == "decimal":
        precision, scale = args
        return f"numeric({int(precision)}, {int(scale)})"
    return COLUMN_TYPES.get(base, "jsonb")


def create_statement(config: dict, schema: Schema) -> sql.Composed:
    """CREATE TABLE for the incoming fields (named as ``field_ide`` says), keyed on
    ``primary_keys``."""
    names = target_columns(config, schema)
    columns = [
        sql.SQL("{n} {t}").format(n=sql.Identifier(n), t=sql.SQL(column_type(k)))
        for n, k in zip(names, schema.kinds, strict=True)
    ]
    if config.get("primary_keys"):
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in config["primary_keys"])
        columns.append(sql.SQL("PRIMARY KEY ({k})").format(k=keys))
    return sql.SQL("CREATE TABLE {t} ({c})").format(
        t=table_ident(config["table"]), c=sql.SQL(", ").join(columns)
    )


class SaveModeTarget(Protocol):
    """What the save modes do to a target table, in its database's own SQL."""

    def exists(self, table: str) -> bool: ...

    def drop(self, table: str) -> None: ...

    def create(self, config: dict, schema: Schema) -> None: ...

    def empty(self, table: str) -> None: ...

    def has_rows(self, table: str) -> bool: ...

    def run(self, statement: str) -> None: ...


def run_save_modes(config: dict, schema: Schema | None, target: SaveModeTarget) -> list[str]:
    """The save modes on ``target``, whatever its database; what was done (for the log).
    Running it again before any row is written leaves the target as once would. ``schema``:
    the incoming one, which a created table takes."""
    done: list[str] = []
    table = config.get("table")
    exists = bool(table and target.exists(table))
    schema_mode, data_mode = config["schema_save_mode"], config["data_save_mode"]
    if table and schema_mode == "RECREATE_SCHEMA" and exists:
        target.drop(table)
        done.append(f"dropped {table}")
        exists = False
    if table and not exists:
        if schema_mode == "ERROR_WHEN_SCHEMA_NOT_EXIST":
            raise SaveModeError(f"no table {table!r} (schema_save_mode = {schema_mode})")
        if schema_mode != "IGNORE":
            if schema is None:
                raise SaveModeError(f"cannot create {table}: the incoming schema is unknown")
            target.create(config, schema)
            done.append(f"created {table}")
            exists = True
    if data_mode == "DROP_DATA" and exists:
        target.empty(table)
        done.append(f"emptied {table}")
    elif data_mode == "ERROR_WHEN_DATA_EXISTS" and exists:
        if target.has_rows(table):
            raise SaveModeError(f"{table} has rows (data_save_mode = {data_mode})")
    elif data_mode == "CUSTOM_PROCESSING":
        target.run(config["custom_sql"])
        done.append("ran custom_sql")
    return done


class _PgTarget:
    """A PostgreSQL target, in one transaction: a step killed half-way changed nothing."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def exists(self, table: str) -> bool:
        return bool(table_columns(self.conn, table))

    def drop(self, table: str) -> None:
        self.conn.execute(sql.SQL("DROP TABLE {t}").format(t=table_ident(table)))

    def create(self, config: dict, schema: Schema) -> None:
        self.conn.execute(create_statement(config, schema))

    def empty(self, table: str) -> None:
        self.conn.execute(sql.SQL("TRUNCATE {t}").format(t=table_ident(table)))

    def has_rows(self, table: str) -> bool:
        query = sql.SQL("SELECT EXISTS (SELECT FROM {t})").format(t=table_ident(table))
        return bool(self.conn.execute(query).fetchone()[0])

    def run(self, statement: str) -> None:
        self.conn.execute(statement)


def apply_save_modes(config: dict, schema: Schema | None) -> list[str]:
    """The save modes on a PostgreSQL target, in one transaction; what was done."""
    options = "-c lock_timeout=10000 -c statement_timeout=300000"
    with connect(config, "keel-savemode", options=options) as conn:
        done = run_save_modes(config, schema, _PgTarget(conn))
        conn.commit()
    return done
