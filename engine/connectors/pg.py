"""PostgreSQL access shared by the Jdbc source and sink: connections, tables, types."""

from __future__ import annotations

import psycopg
from psycopg import sql

PG_TYPES = {
    "smallint": "int",
    "integer": "int",
    "bigint": "bigint",
    "text": "string",
    "character varying": "string",
    "character": "string",
    "double precision": "double",
    "real": "float",
    "numeric": "decimal",
    "boolean": "boolean",
    "date": "string",
    "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamp",
    "uuid": "string",
    "json": "string",
    "jsonb": "string",
}
INTEGER_TYPES = ("smallint", "integer", "bigint")


def connect(config: dict, application_name: str = "keel-jdbc", **kwargs) -> psycopg.Connection:
    url = config["url"]
    if url.startswith("jdbc:"):
        url = url[len("jdbc:") :]
    if not url.startswith(("postgresql://", "postgres://")):
        raise ValueError("only PostgreSQL URLs are supported (jdbc:postgresql://host:port/db)")
    return psycopg.connect(
        url,
        user=config.get("user") or None,
        password=config.get("password") or None,
        connect_timeout=5,
        application_name=application_name[:63],
        **kwargs,
    )


def split_table(name: str) -> tuple[str, str]:
    schema, _, table = name.rpartition(".")
    return schema or "public", table


def table_columns(conn: psycopg.Connection, table: str) -> list[tuple[str, str]]:
    schema, name = split_table(table)
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, name),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def primary_key(conn: psycopg.Connection, table: str) -> list[str]:
    schema, name = split_table(table)
    rows = conn.execute(
        """
        SELECT a.attname FROM pg_index i
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
         WHERE i.indrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass
           AND i.indisprimary
        """,
        (schema, name),
    ).fetchall()
    return [r[0] for r in rows]


def table_ident(table: str) -> sql.Identifier:
    schema, name = split_table(table)
    return sql.Identifier(schema, name)
