"""The Jdbc connector's checks of a block when the job is planned: which database and table it
names (``table_path``, ``schema``), and a table or a query."""

from __future__ import annotations

import re

import psycopg

from engine.connectors.jdbc_options import database_refusal
from engine.connectors.pg import connect, table_columns
from engine.connectors.pg_url import pg_target


def pg_connection_errors(
    config: dict, table_required: bool, missing_ok: bool
) -> list[tuple[str, str]]:
    """PostgreSQL's side of engine.connectors.dialects.check_connection: ``table_path`` and
    ``schema`` as
    ``schema.table``, then the database and the table."""
    if config.get("table_path"):
        error = _table_from_path(config)
        if error:
            return [error]
    error = _table_in_schema(config)
    if error:
        return [error]
    try:
        with connect(config) as conn:
            columns = table_columns(conn, config["table"]) if config["table"] else []
            dbname = conn.info.dbname
    except ValueError as exc:
        return [("connection" if config.get("connection") else "url", str(exc))]
    except psycopg.Error as exc:
        reason = (str(exc).strip().splitlines() or ["error"])[0]
        return [("url", f"cannot connect: {reason}")]
    if config.get("database") and config["database"] != dbname:
        return [("database", f"{config['database']!r} is not the url's database ({dbname!r})")]
    if config["table"] and not columns and not missing_ok:
        return [("table", f"no table {config['table']!r} in that database")]
    return table_required_errors(config, table_required)


def table_required_errors(config: dict, table_required: bool) -> list[tuple[str, str]]:
    if table_required and not config["table"]:
        return [("table", "is required")]
    return []


def table_or_query(
    config: dict, has_table: bool, statement: re.Pattern, kind: str, both: bool = False
) -> list[tuple[str, str]]:
    """A table or a query (``both``: or the two, the table naming what the query reads), and
    the query of the kind this side runs. Another database is refused first, before what its
    own SQL dialect may make of the query."""
    refusal = database_refusal(config)
    if refusal:
        return [refusal]
    if not config["query"] and not has_table:
        return [("query", "give table (or table_path) or query")]
    if config["query"] and has_table and not both:
        return [("query", "give either table or query")]
    if config["query"] and not statement.match(config["query"]):
        return [("query", f"must be one {kind} statement")]
    return []


def _table_from_path(config: dict) -> tuple[str, str] | None:
    """SeaTunnel's ``table_path`` (``database.schema.table``, ``schema.table`` or ``table``)
    as ``table``; its database, if named, must be the url's."""
    parts = config["table_path"].split(".")
    if len(parts) > 3 or not all(parts):
        return ("table_path", "must be database.schema.table, schema.table or table")
    if config["table"] and config["table"] != ".".join(parts[-2:]):
        return ("table_path", f"names another table than table ({config['table']!r})")
    if len(parts) == 3:
        config["database"] = config.get("database") or parts[0]
        if config["database"] != parts[0]:
            return ("table_path", f"names database {parts[0]!r}, database says otherwise")
    config["table"] = ".".join(parts[-2:])
    return None


def _table_in_schema(config: dict) -> tuple[str, str] | None:
    """SeaTunnel's ``schema`` option, else the url's ``currentSchema`` (its first schema): the
    schema of a ``table`` that names none."""
    schema, table = config.get("schema"), config.get("table")
    if not table:
        return None
    if "." not in table:
        schema = schema or _current_schema(config)
        if schema:
            config["table"] = f"{schema}.{table}"
    elif schema and table.rsplit(".", 1)[0] != schema:
        return ("schema", f"says {schema!r}, table {table!r} another schema")
    return None


def _current_schema(config: dict) -> str:
    if config.get("connection") or not config.get("url"):
        return ""
    try:
        path = pg_target(config["url"], config.get("properties")).libpq.get("search_path", "")
    except ValueError:
        return ""
    return path.split(",")[0].strip().strip('"')


def where_clause(condition: str) -> str:
    """SeaTunnel writes ``where_condition`` with its keyword (``where id > 100``)."""
    text = condition.strip()
    if text[:5].lower() == "where" and (
        len(text) == 5 or not (text[5].isalnum() or text[5] == "_")
    ):
        return text[5:].strip()
    return text
