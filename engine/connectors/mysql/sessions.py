"""MySQL sessions through PyMySQL: every one with connect, read and write timeouts, UTC, and
LOAD DATA LOCAL INFILE fed from memory, never from a file: a server that asks for any other
"file" than the batch Keel offered gets nothing."""

from __future__ import annotations

import dataclasses
import ssl as ssllib

import pymysql
from pymysql import err
from pymysql.connections import Connection, LoadLocalPacketWrapper, MySQLResult

from engine.connectors.boundaries import Refused
from engine.connectors.jdbc_dialect import named_connection
from engine.connectors.mysql.urls import MySqlUrl, check_target, parse_url

#: The name a LOAD DATA statement gives its in-memory batch.
BATCH_NAME = "keel-batch"
#: Bytes per packet of a batch sent to LOAD DATA (under every server's max_allowed_packet).
PACKET = 1 << 20
Error = pymysql.MySQLError
#: PyMySQL's error when TLS was asked for and the server offers none.
SSL_UNSUPPORTED = 2026
#: The largest ORDER BY key the server compares (its maximum): keys are never cut.
MAX_SORT_LENGTH = 8_388_608
#: The server's error for a variable it does not have (MySQL has no max_statement_time).
UNKNOWN_VARIABLE = 1193
#: Seconds a statement waits for a lock (a table's metadata lock, a row's) before failing:
#: a stuck session's lock ends this session's statement, never hangs it (as PostgreSQL's
#: sink sessions' lock_timeout).
LOCK_WAIT = 10
#: Seconds a statement of a sink, save-mode or check session may run (PostgreSQL's sinks'
#: statement_timeout); a split's streamed read has none: it lasts as long as its rows.
STATEMENT_LIMIT = 300


class _Result(MySQLResult):
    def _read_load_local_packet(self, first_packet) -> None:
        conn: KeelConnection = self.connection  # type: ignore[assignment]
        asked = LoadLocalPacketWrapper(first_packet).filename
        payload, conn.payload = conn.payload, None
        offered = payload is not None and asked in (BATCH_NAME.encode(), BATCH_NAME)
        if offered:
            view = memoryview(payload)
            for start in range(0, len(view), PACKET):
                conn.write_packet(bytes(view[start : start + PACKET]))
        conn.write_packet(b"")  # the end of the "file"
        reply = conn._read_packet()
        if not offered:
            raise err.OperationalError(2000, f"the server asked for a file ({asked!r}): refused")
        self._read_ok_packet(reply)


class KeelConnection(Connection):
    """PyMySQL's connection whose LOAD DATA LOCAL sends ``payload`` (set just before the
    statement) and nothing else."""

    payload: bytes | None = None

    def _read_query_result(self, unbuffered: bool = False) -> int:
        if unbuffered:
            return super()._read_query_result(unbuffered)
        self._result = None
        result = _Result(self)
        result.read()
        self._result = result
        if result.server_status is not None:
            self.server_status = result.server_status
        return result.affected_rows


def credentials(config: dict) -> tuple[str, str, str, bool]:
    """(url, user, password, named): an admin's named connection, or the config's url, user
    and password (both required: a job never borrows the process's own)."""
    stored = named_connection(config)
    if stored is not None:
        return stored.url, stored.user, stored.password(), True
    if not config.get("url"):
        raise Refused("give a url (with user and password), or a named connection")
    if not config.get("user"):
        # An empty password is MySQL's own (root without one): PyMySQL reads no option file
        # or environment, so the job never borrows the process's credentials.
        raise Refused("user is required (or a named connection)")
    return config["url"], config["user"], config.get("password") or "", False


def requested_database(config: dict) -> str:
    """The database a job names beside its URL: the ``database`` option, else the one
    ``table_path`` (or ``table``) qualifies its table with (SeaTunnel's MySQL catalogs)."""
    if config.get("database"):
        return config["database"]
    for option in ("table_path", "table"):
        parts = (config.get(option) or "").split(".")
        if len(parts) == 2 and all(parts):
            return parts[0]
    return ""


def target(config: dict) -> tuple[MySqlUrl, str, str]:
    """The parsed URL (with the ``properties`` option's driver parameters) allowed for this
    job, and its user and password (Refused otherwise)."""
    url, user, password, named = credentials(config)
    parsed = parse_url(url, config.get("properties"))
    wanted = requested_database(config)
    if wanted and wanted != parsed.database:
        if named:
            raise Refused(
                f"the named connection's database is {parsed.database!r}, not {wanted!r}: "
                "ask an admin for a connection to it"
            )
        parsed = dataclasses.replace(parsed, database=wanted)  # allowed as any URL would be
    check_target(parsed, named)
    return parsed, user, password


def _ssl(url: MySqlUrl) -> ssllib.SSLContext | None:
    if url.ssl_mode == "DISABLED":
        return None
    context = ssllib.create_default_context()
    context.check_hostname = url.ssl_mode == "VERIFY_IDENTITY"
    if url.ssl_mode in ("PREFERRED", "REQUIRED"):
        context.verify_mode = ssllib.CERT_NONE
    return context


def connect(
    config: dict,
    *,
    read_only: bool = False,
    streaming: bool = False,
    program: str = "keel-jdbc",
) -> KeelConnection:
    """A session on the job's database (autocommit off, time zone from the URL: UTC unless
    serverTimezone says otherwise). ``read_only``: every transaction is read-only (a source).
    ``streaming``: its cursors stream rows from the server instead of buffering them. Values
    come back as the server's text (decoded into Arrow by engine.connectors.mysql.types)."""
    url, user, password = target(config)
    options = {
        "host": url.host,
        "port": url.port,
        "user": user,
        "password": password,
        "database": url.database,
        "charset": url.charset,
        "connect_timeout": (config.get("connect_timeout_ms") or 0) / 1000 or url.connect_timeout,
        "read_timeout": url.socket_timeout,
        "write_timeout": url.socket_timeout,
        "autocommit": False,
        "local_infile": url.local_infile and not read_only,
        "conv": dict(pymysql.converters.encoders),  # no decoders: values as text
        "cursorclass": pymysql.cursors.SSCursor if streaming else pymysql.cursors.Cursor,
        "program_name": program[:32],
    }
    try:
        conn = KeelConnection(ssl=_ssl(url), **options)
    except err.OperationalError as exc:
        if url.ssl_mode != "PREFERRED" or exc.args[0] != SSL_UNSUPPORTED:
            raise
        conn = KeelConnection(ssl=None, **options)  # preferred, and the server has none
    try:
        if url.ssl_mode != "PREFERRED" and url.ssl_mode != "DISABLED" and not _encrypted(conn):
            raise Refused(f"sslMode {url.ssl_mode}: the server does not encrypt")
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            cur.execute("SET time_zone = %s", (url.time_zone,))
            _limits(cur, streaming or read_only)
            if read_only:
                cur.execute("SET SESSION TRANSACTION READ ONLY")
        conn.commit()
    except BaseException:
        conn.close()
        raise
    conn.url = url  # type: ignore[attr-defined]
    return conn


def _limits(cur, reads: bool) -> None:
    """The session's lock waits; ORDER BY keys compared whole (the default cuts them at 1024
    bytes, and a split's order must be total); and, for a session that writes, a statement
    time limit: MariaDB's ``max_statement_time`` (every statement), else MySQL's
    ``max_execution_time``. A reading session has none: a split, or the scans that plan
    splits, last as long as the table is large (as on PostgreSQL)."""
    cur.execute(
        f"SET SESSION lock_wait_timeout = {LOCK_WAIT}, innodb_lock_wait_timeout = {LOCK_WAIT},"
        f" max_sort_length = {MAX_SORT_LENGTH}"
    )
    if reads:
        return
    try:
        cur.execute(f"SET SESSION max_statement_time = {STATEMENT_LIMIT}")
    except err.MySQLError as exc:
        if exc.args[0] != UNKNOWN_VARIABLE:
            raise
        cur.execute(f"SET SESSION max_execution_time = {STATEMENT_LIMIT * 1000}")


def _encrypted(conn: Connection) -> bool:
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        row = cur.fetchone()
    return bool(row and row[1])


def local_infile_allowed(conn: KeelConnection) -> bool:
    """Whether the URL and the server both allow LOAD DATA LOCAL (MySQL 8 refuses it by
    default; MariaDB allows it)."""
    if not conn.url.local_infile:  # type: ignore[attr-defined]
        return False
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute("SELECT @@local_infile")
        value = cur.fetchone()[0]
    return str(value.decode() if isinstance(value, bytes) else value) in ("1", "ON")


def load_data(conn: KeelConnection, table: str, columns: list[str], payload: bytes) -> int:
    """LOAD DATA LOCAL INFILE of ``payload`` (rows in LOAD DATA's default text format:
    tab-separated, ``\\N`` for NULL, backslash escapes; engine.connectors.mysql.types
    .load_payload) into ``columns`` of ``table`` (quoted); the rows loaded."""
    conn.payload = payload
    try:
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            return cur.execute(
                f"LOAD DATA LOCAL INFILE '{BATCH_NAME}' INTO TABLE {table} CHARACTER SET binary"
                f" ({', '.join(columns)})"
            )
    finally:
        conn.payload = None


def quote(name: str) -> str:
    """A MySQL identifier, quoted (``db.table`` quotes both parts)."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in name.split("."))


def text(value) -> str | None:
    """A value a text-protocol session returned, as str."""
    return value.decode() if isinstance(value, bytes) else value
