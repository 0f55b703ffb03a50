"""PostgreSQL access shared by the Jdbc source and sink: connections, tables, types."""

from __future__ import annotations

import math
import os

import psycopg
from psycopg import sql

from engine.connectors.boundaries import Refused, check_database
from engine.connectors.jdbc_dialect import named_connection
from engine.connectors.jdbc_url import parse_jdbc_url
from engine.connectors.pg_url import pg_target, session_params

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
    "bytea": "bytes",
}
INTEGER_TYPES = ("smallint", "integer", "bigint")
#: The same types by the names of their OIDs (a query's columns, from its description).
PG_TYPE_NAMES = {
    "int2": "int",
    "int4": "int",
    "int8": "bigint",
    "text": "string",
    "varchar": "string",
    "bpchar": "string",
    "name": "string",
    "float8": "double",
    "float4": "float",
    "numeric": "decimal",
    "bool": "boolean",
    "date": "string",
    "timestamp": "timestamp",
    "timestamptz": "timestamp",
    "uuid": "string",
    "json": "string",
    "jsonb": "string",
    "bytea": "bytes",
}
INTEGER_TYPE_NAMES = ("int2", "int4", "int8")


def credentials(config: dict) -> tuple[str, str, str, bool]:
    """(url, user, password, named): from the named connection if the config gives one, else
    from the config (the URL's own ``user`` and ``password`` parameters stand in for missing
    options), which must then carry both user and password (the process's PGUSER, PGPASSWORD
    and password file are never used for a job)."""
    stored = named_connection(config)
    if stored is not None:
        url, user, password, named = stored.url, stored.user, stored.password(), True
    else:
        url, user, password, named = config.get("url") or "", config.get("user"), "", False
        password = config.get("password") or ""
        if not url:
            raise Refused("give a url (with user and password), or a named connection")
    given = pg_target(url, config.get("properties"))
    for option, value, in_url in (
        ("user", user, given.user),
        ("password", password, given.password),
    ):
        if value and in_url and value != in_url:
            raise Refused(f"the URL's {option} is not the {option} option's: give one")
    user, password = user or given.user, password or given.password
    if not user or not password:
        raise Refused("user and password are required (or a named connection)")
    return url, user, password, named


def target_params(config: dict) -> tuple[dict[str, str], str, str]:
    """(libpq parameters, user, password) of the job's database, after the boundaries allow
    it (Refused otherwise). A URL without a database means the ``database`` option's, else
    the user's (as in pgJDBC)."""
    url, user, password, named = credentials(config)
    database = config.get("database") or user
    params = check_database(url, named, config.get("properties"), database)
    timeout_ms = config.get("connect_timeout_ms")
    if timeout_ms and "connect_timeout" not in params:  # libpq waits 2 s at least
        params["connect_timeout"] = str(max(2, math.ceil(timeout_ms / 1000)))
    return params, user, password


def url_notes(config: dict) -> list[tuple[str, str]]:
    """A warning per URL parameter (or ``properties`` entry) that has no effect here."""
    if config.get("connection") or not config.get("url"):
        return []
    properties = config.get("properties") or {}
    try:
        target = pg_target(config["url"], properties)
    except ValueError:  # the checks say what is wrong with it
        return []
    in_url = {k for k, _ in parse_jdbc_url(config["url"]).params}
    return [
        ("url" if key in in_url or key not in properties else f"properties.{key}", f"{key}: {why}")
        for key, why in target.warnings
    ]


def connect(config: dict, application_name: str = "keel-jdbc", **kwargs) -> psycopg.Connection:
    """A session on the job's database, after the boundaries allow it (Refused otherwise);
    ``options`` (Keel's ``-c ...``) come after the URL's, so Keel's win."""
    params, user, password = target_params(config)
    return psycopg.connect(
        host=params["host"],
        port=params.get("port") or None,
        dbname=params["dbname"],
        user=user,
        password=password,
        passfile=os.devnull,
        application_name=application_name[:63],
        **session_params(params, kwargs.pop("options", "")),
        **kwargs,
    )


def split_table(name: str) -> tuple[str, str]:
    """``schema.table`` (or ``table``: public), as SeaTunnel's ``table``; a ``table_path`` of
    ``database.schema.table`` is reduced to this when the job is planned."""
    schema, _, table = name.rpartition(".")
    return schema or "public", table


def database_name(config: dict) -> str:
    """The database the job's url (or named connection) names."""
    return target_params(config)[0]["dbname"]


def user_sql(text: str) -> sql.SQL:
    """A job's own SQL (a source ``query``, a ``where_condition``) as a fragment of a statement
    that also takes parameters: its ``%`` are literal. It runs in a read-only transaction."""
    return sql.SQL(text.strip().rstrip(";").replace("%", "%%"))


def connect_read_only(config: dict) -> psycopg.Connection:
    """A source session: every transaction in it is read-only, those psycopg opens and any a
    statement opens itself (``default_transaction_read_only``), so a job's query can read its
    database, never change it. Statements with a job's SQL in them also always go through the
    extended protocol (they carry a parameter), which refuses a second statement."""
    conn = connect(config, options="-c default_transaction_read_only=on")
    conn.read_only = True
    return conn


def query_columns(conn: psycopg.Connection, rows: sql.Composable) -> list[tuple[str, str]]:
    """(name, type name) of the columns of ``rows`` (``(SELECT ...) AS alias``), without
    reading any row."""
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT * FROM {rows} LIMIT %s").format(rows=rows), (0,))
        out = []
        for column in cur.description:
            info = psycopg.postgres.types.get(column.type_code)
            name = info.name if info else str(column.type_code)
            # The registry finds a type by its array's OID too: an array is its own type.
            array = info is not None and info.array_oid == column.type_code
            out.append((column.name, f"{name}[]" if array else name))
    conn.rollback()
    return out


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
