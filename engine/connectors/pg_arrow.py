"""PostgreSQL in Arrow, through ADBC's driver (binary COPY both ways, in C++): the sessions a
job's Jdbc source and sink move rows on, and the types on each side. psycopg stays for small
statements (engine.connectors.pg); the same boundaries apply to both."""

from __future__ import annotations

import os
from urllib.parse import quote, urlencode

import pyarrow as pa
from psycopg import sql

from engine.connectors.arrowrows import arrow_type
from engine.connectors.pg import PG_TYPE_NAMES, PG_TYPES, target_params
from engine.connectors.pg_url import session_params
from engine.connectors.schema import kind_args

#: How a source column of each PostgreSQL type is selected so ADBC answers in the Arrow type
#: of its Keel kind (engine.connectors.pg's PG_TYPES): a cast where the two differ.
_SELECT_AS = {
    "smallint": "{c}::integer",
    "int2": "{c}::integer",
    "date": "{c}::text",
    "uuid": "{c}::text",
    "json": "{c}::text",
    "jsonb": "{c}::text",
    "name": "{c}::text",
    "character": "{c}::text",
    "bpchar": "{c}::text",
    "timestamp with time zone": "{c} AT TIME ZONE 'UTC'",
    "timestamptz": "{c} AT TIME ZONE 'UTC'",
}

#: The Keel kind whose Arrow type ADBC writes with binary COPY into a column of each PostgreSQL
#: type (binary COPY takes only a column's own type); a column of a type not here is staged as
#: text. A timestamp with time zone is written from UTC microseconds.
_INGEST_KINDS = {
    "smallint": "smallint",
    "integer": "int",
    "bigint": "bigint",
    "real": "float",
    "double precision": "double",
    "boolean": "boolean",
    "text": "string",
    "character varying": "string",
    "bytea": "bytes",
    "date": "date",
    "timestamp without time zone": "timestamp",
}


def uri(config: dict, application_name: str, options: str = "") -> str:
    """A libpq URI for the job's database, after the boundaries allow it (Refused otherwise):
    its credentials in it, no password file, the URL's session parameters (a connect timeout),
    and ``options`` (``-c ...``) after the URL's own."""
    params, user, password = target_params(config)
    ports = str(params.get("port") or "").split(",")
    hosts = []
    for i, host in enumerate(params["host"].split(",")):
        port = ports[i] if i < len(ports) else ""
        hosts.append((f"[{host}]" if ":" in host else host) + (f":{port}" if port else ""))
    query = {
        "application_name": application_name[:63],
        "passfile": os.devnull,
        **session_params(params, options),
    }
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}"
    return f"postgresql://{auth}@{','.join(hosts)}/{quote(params['dbname'], safe='')}?" + urlencode(
        query, quote_via=quote
    )


def connect(config: dict, application_name: str, options: str = "", autocommit: bool = False):
    """An ADBC session on the job's database (not autocommitting unless asked: a session that
    runs its own BEGIN, PREPARE TRANSACTION and COMMIT autocommits)."""
    import adbc_driver_postgresql.dbapi as adbc

    return adbc.connect(uri(config, application_name, options), autocommit=autocommit)


def select_list(columns: list[tuple[str, str, str]]) -> sql.Composable:
    """The source's columns (name, PostgreSQL type, Keel kind), each cast where ADBC's Arrow
    type is not its Keel kind's (a numeric as the text of its decimal, exact, which Arrow
    casts to decimal128); names are qualified (``keel_query.c``), so an ORDER BY of a name
    means the column, not a cast. A type without a Keel mapping is read as its text."""
    items = []
    for name, pg_type, kind in columns:
        column = sql.SQL("keel_query.{c}").format(c=sql.Identifier(name))
        known = pg_type in PG_TYPES or pg_type in PG_TYPE_NAMES
        shape = _SELECT_AS.get(pg_type, "{c}" if known else "{c}::text")
        if pg_type == "numeric":
            precision, scale = kind_args(kind)[1]
            shape = f"{{c}}::numeric({int(precision)}, {int(scale)})::text"
        items.append(
            sql.SQL("{e} AS {n}").format(e=sql.SQL(shape).format(c=column), n=sql.Identifier(name))
        )
    return sql.SQL(", ").join(items)


def ingest_type(pg_type: str) -> pa.DataType | None:
    """The Arrow type binary COPY takes for a column of ``pg_type``; None: stage it as text."""
    if pg_type == "timestamp with time zone":
        return pa.timestamp("us", tz="UTC")
    kind = _INGEST_KINDS.get(pg_type)
    return None if kind is None else arrow_type(kind)
