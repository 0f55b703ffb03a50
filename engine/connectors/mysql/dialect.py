"""MySQL and MariaDB as a Jdbc dialect (engine.connectors.dialects): the table a block names
(``database.table`` or ``table``, always in the URL's database: the allow-list names it), the
source's checks, splits and reads (engine.connectors.mysql.source), the sink's save modes and
writers (engine.connectors.mysql.writers)."""

from __future__ import annotations

import logging

import pymysql

from engine.connectors.base import SinkWriter
from engine.connectors.jdbc_checks import table_required_errors
from engine.connectors.jdbc_dialect import Dialect
from engine.connectors.jdbc_savemodes import run_save_modes
from engine.connectors.jdbc_splits import bound_errors
from engine.connectors.jdbc_statements import target_columns
from engine.connectors.mysql import source
from engine.connectors.mysql.sessions import connect, quote, target
from engine.connectors.mysql.types import create_table_sql, mysql_type
from engine.connectors.mysql.urls import parse_url
from engine.connectors.mysql.writers import MySqlExactlyOnceWriter, MySqlWriter
from engine.connectors.schema import Schema
from engine.errortext import first_line

log = logging.getLogger("keel.jdbc")


def _table_name(config: dict, database: str) -> tuple[str, str] | None:
    """``table_path`` (``database.table`` or ``table``) and ``table`` as the bare table name
    in ``database`` (the job's: the URL's, or the one its options name, which the allow-list
    admitted)."""
    names = []
    for option in ("table_path", "table"):
        parts = (config.get(option) or "").split(".")
        if parts == [""]:
            continue
        if len(parts) > 2 or not all(parts):
            return (option, "must be database.table or table (MySQL has no schemas)")
        if len(parts) == 2 and parts[0] != database:
            return (option, f"names database {parts[0]!r}, the job's is {database!r}")
        if len(parts) == 2:
            # The bare name replaces ``table`` below: the database stays the job's.
            config["database"] = config.get("database") or parts[0]
        names.append(parts[-1])
    if len(set(names)) > 1:
        return ("table_path", f"names another table than table ({config['table']!r})")
    if names:
        config["table"] = names[0]
    if config.get("database") and config["database"] != database:
        return ("database", f"{config['database']!r} is not the job's database ({database!r})")
    return None


class _SaveModes:
    """A MySQL target for the save modes. MySQL commits each DDL statement itself, so the
    steps are not one transaction; each is idempotent while no row is written."""

    def __init__(self, conn, config: dict) -> None:
        self.conn, self.config = conn, config

    def _execute(self, statement: str) -> list[tuple]:
        with self.conn.cursor(pymysql.cursors.Cursor) as cur:
            cur.execute(statement)
            return list(cur.fetchall())

    def exists(self, table: str) -> bool:
        return bool(source.table_columns(self.conn, *source.split_table(self.config, table)))

    def drop(self, table: str) -> None:
        self._execute(f"DROP TABLE IF EXISTS {quote(table)}")

    def create(self, config: dict, schema: Schema) -> None:
        names = target_columns(config, schema)
        named = Schema(tuple(zip(names, schema.kinds, strict=True)))
        self._execute(create_table_sql(quote(config["table"]), named, config.get("primary_keys")))

    def empty(self, table: str) -> None:
        self._execute(f"TRUNCATE TABLE {quote(table)}")

    def has_rows(self, table: str) -> bool:
        return bool(self._execute(f"SELECT 1 FROM {quote(table)} LIMIT 1"))

    def run(self, statement: str) -> None:
        self._execute(statement)


class MySqlDialect(Dialect):
    name = "MySQL"
    errors = (pymysql.MySQLError,)

    def notes(self, config: dict) -> list[tuple[str, str]]:
        if config.get("connection") or not config.get("url"):
            return []
        try:
            parsed = parse_url(config["url"], config.get("properties"))
        except ValueError:  # the checks say what is wrong with it
            return []
        return [("url", warning) for warning in parsed.warnings]

    def connection_errors(self, config, table_required, missing_ok):
        option = "connection" if config.get("connection") else "url"
        try:
            database = target(config)[0].database
        except ValueError as exc:
            return [(option, str(exc))]
        error = _table_name(config, database)
        if error:
            return [error]
        try:
            with connect(config, read_only=True) as conn:
                columns = (
                    source.table_columns(conn, database, config["table"]) if config["table"] else []
                )
        except ValueError as exc:
            return [(option, str(exc))]
        except pymysql.MySQLError as exc:
            return [(option, f"cannot connect: {first_line(exc)}")]
        if config["table"] and not columns and not missing_ok:
            return [("table", f"no table {config['table']!r} in database {database!r}")]
        return table_required_errors(config, table_required)

    def placeholder_names(self, config: dict) -> dict[str, str]:
        database, table = source.split_table(config, config["table"])
        return {
            "${database_name}": database,
            "${schema_name}": "",
            "${table_name}": table,
            "${table_full_name}": f"{database}.{table}",
        }

    def source_errors(self, config: dict) -> list[tuple[str, str]]:
        rows = "query" if config["query"] else "where_condition"
        rows = rows if config["query"] or config["where_condition"] else "table"
        try:
            with connect(config, read_only=True) as conn:
                try:
                    source.columns(conn, config)
                except ValueError as exc:
                    return [("query" if config["query"] else "table", str(exc))]
                try:
                    column, _, integer = source.partition_column(conn, config)
                except ValueError as exc:
                    return [("partition_column", str(exc))]
        except pymysql.MySQLError as exc:
            return [(rows, first_line(exc))]
        return bound_errors(config, column, integer)

    def output_schema(self, config: dict) -> Schema:
        return source.output_schema(config)

    def create_splits(self, config: dict) -> list[dict]:
        return source.create_splits(config)

    def read(self, config: dict, split: dict, offset: int, batch_size: int):
        return source.read_split(config, split, offset, batch_size)

    def table_columns(self, config: dict) -> set[str]:
        with connect(config, read_only=True) as conn:
            return {
                name
                for name, _ in source.table_columns(
                    conn, *source.split_table(config, config["table"])
                )
            }

    def sink_errors(self, config: dict) -> list[tuple[str, str]]:
        if config["query"] and config["is_exactly_once"]:
            return [("is_exactly_once", "a custom query is not written exactly once on MySQL")]
        return []

    def apply_save_modes(self, config: dict, schema: Schema | None) -> list[str]:
        with connect(config, program="keel-savemode") as conn:
            done = run_save_modes(config, schema, _SaveModes(conn, config))
            conn.commit()
        return done

    def add_columns(self, config: dict, added: list[tuple[str, str]]) -> None:
        """The table takes the columns it lacks (MySQL has no ``ADD COLUMN IF NOT EXISTS``:
        those present are left out, so a restore's second time changes nothing); a lock
        another session holds past ``lock_wait_timeout`` is tried again later."""
        from engine.sourceruntime.schema_change import SchemaChangePending

        names = target_columns(config, Schema(tuple(added)))
        table = config["table"]
        try:
            with connect(config, program="keel-schema-change") as conn:
                where = source.split_table(config, table)
                # MySQL's column names are not case-sensitive.
                present = {c.lower() for c, _ in source.table_columns(conn, *where)}
                with conn.cursor(pymysql.cursors.Cursor) as cur:
                    # Its lock waited for 1 s at most: the table's writers queue behind it.
                    cur.execute("SET SESSION lock_wait_timeout = 1")
                    for name, (_, kind) in zip(names, added, strict=True):
                        if name.lower() not in present:
                            column = "`" + name.replace("`", "``") + "`"  # a dot is its own
                            cur.execute(
                                f"ALTER TABLE {quote(table)} ADD COLUMN {column} {mysql_type(kind)}"
                            )
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == 1205:  # lock wait timeout exceeded
                raise SchemaChangePending(str(exc)) from exc
            raise

    def writer(self, config: dict, schema: Schema, context: dict) -> SinkWriter:
        """Checkpointed: the stage and its fence row (is_exactly_once or not: SeaTunnel's XA
        is not used), except a custom query, which runs at least once; else at least once."""
        if context.get("checkpointing") and not config.get("query"):
            return MySqlExactlyOnceWriter(config, schema, context)
        if context.get("checkpointing"):
            log.warning("%s: a custom query on MySQL runs at least once", context.get("label"))
        return MySqlWriter(config, schema, context)
