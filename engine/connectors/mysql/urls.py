"""MySQL and MariaDB JDBC URLs: ``jdbc:mysql://host:port/database?params`` (and
``jdbc:mariadb://``), their Connector/J and MariaDB-driver parameters as the session options
they mean, and the admin's boundaries (``engine.connectors.jdbc-allowed``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.conf import settings

from engine.connectors.boundaries import Refused, _pattern_matches
from engine.connectors.jdbc_dialect import is_mysql_url
from engine.connectors.jdbc_url import parse_jdbc_url

SCHEMES = ("mysql", "mariadb")
CREDENTIALS_IN_URL = "put credentials in the user and password options, not in the URL"
DEFAULT_PORT = 3306
ONE_HOST = "the URL must name one host (jdbc:mysql://host:port/database)"
#: Seconds: connecting, and waiting on one read or write of the socket (a statement that
#: sends nothing back for this long is given up).
CONNECT_TIMEOUT = 5.0
SOCKET_TIMEOUT = 300.0

#: Java charset names (characterEncoding) as MySQL's.
CHARSETS = {
    "utf-8": "utf8mb4",
    "utf8": "utf8mb4",
    "utf8mb4": "utf8mb4",
    "iso-8859-1": "latin1",
    "latin1": "latin1",
    "cp1252": "latin1",
    "us-ascii": "ascii",
    "ascii": "ascii",
    "gbk": "gbk",
    "gb2312": "gb2312",
    "big5": "big5",
}
#: Parameters that change nothing here, with why (accepted silently: they describe what
#: Keel does anyway).
QUIET = {
    "useunicode": "text is always Unicode",
    "rewritebatchedstatements": "batches are always written in bulk",
    "usecursorfetch": "splits are always streamed",
    "defaultfetchsize": "splits are streamed in batches of engine.dataplane.batch-rows",
    "useserverprepstmts": "statements are sent as text",
    "cacheprepstmts": "statements are sent as text",
    "allowpublickeyretrieval": "the driver retrieves the key when asked",
    "usejdbccomplianttimezoneshift": "timestamps are read as the server's text",
    "uselegacydatetimecode": "timestamps are read as the server's text",
    "useoldaliasmetadatabehavior": "columns are named by their labels",
    "nullcatalogmeanscurrent": "the url's database is the catalog",
}


@dataclass
class MySqlUrl:
    """A parsed URL: where to connect and the session options its parameters mean."""

    scheme: str
    host: str
    port: int
    database: str
    ssl_mode: str = "PREFERRED"  # DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY
    connect_timeout: float = CONNECT_TIMEOUT
    socket_timeout: float = SOCKET_TIMEOUT
    charset: str = "utf8mb4"
    time_zone: str = "+00:00"
    local_infile: bool = True
    tiny_int1_is_bit: bool = True
    zero_dates: str = "null"  # null, round or exception (zeroDateTimeBehavior)
    warnings: list[str] = field(default_factory=list)


def parse_url(url: str, properties: dict | None = None) -> MySqlUrl:
    """The URL's parts; Refused (naming what is wrong) for anything else than one host, a
    database and parameters; unknown parameters are kept as warnings. ``properties``
    (SeaTunnel's option of driver parameters) apply after the URL's, as in Connector/J."""
    rest = url.strip().split(":", 2)[2] if is_mysql_url(url) else ""
    # Connector/J's load-balanced and replication forms (jdbc:mysql:loadbalance://...).
    if rest.lower().startswith(("loadbalance:", "replication:")):
        raise Refused(ONE_HOST)
    if not rest.startswith("//"):
        raise Refused("not a MySQL URL (jdbc:mysql://host:port/database)")
    try:
        given = parse_jdbc_url(url)
    except ValueError as exc:
        # A user:password whose '/' or '?' split the URL: no part of it is ever shown.
        raise Refused(CREDENTIALS_IN_URL if "@" in url else str(exc)) from None
    if any(given.userinfo):
        raise Refused(CREDENTIALS_IN_URL)
    if len(given.hosts) != 1:
        raise Refused(ONE_HOST)
    host, port = given.hosts[0]
    if port and not 0 < int(port) < 65536:
        raise Refused(f"port {port!r} is not a port number")
    # No database: the table's or the database option's.
    parsed = MySqlUrl(given.subprotocol, host, int(port or DEFAULT_PORT), given.database)
    for key, value in given.params:
        _apply(parsed, key, value)
    for key, value in (properties or {}).items():
        _apply(parsed, str(key), str(value).lower() if isinstance(value, bool) else str(value))
    return parsed


def _true(value: str) -> bool:
    return value.strip().lower() in ("true", "1", "yes", "on")


def _seconds(key: str, value: str) -> float:
    if not value.strip().isdigit():
        raise Refused(f"URL parameter {key} must be milliseconds (an integer)")
    return int(value) / 1000


def _apply(url: MySqlUrl, key: str, value: str) -> None:
    """One URL parameter (Connector/J's or the MariaDB driver's spelling) onto ``url``."""
    name = key.lower()
    if name in ("user", "password"):
        raise Refused(CREDENTIALS_IN_URL)
    if name in ("usessl", "requiressl"):
        if not _true(value):
            url.ssl_mode = "DISABLED" if name == "usessl" else url.ssl_mode
        elif url.ssl_mode in ("PREFERRED", "DISABLED"):
            url.ssl_mode = "REQUIRED"
    elif name == "verifyservercertificate":
        if _true(value) and url.ssl_mode in ("PREFERRED", "REQUIRED"):
            url.ssl_mode = "VERIFY_CA"
    elif name == "sslmode":
        modes = {
            "disabled": "DISABLED",
            "disable": "DISABLED",
            "preferred": "PREFERRED",
            "required": "REQUIRED",
            "trust": "REQUIRED",
            "verify_ca": "VERIFY_CA",
            "verify-ca": "VERIFY_CA",
            "verify_identity": "VERIFY_IDENTITY",
            "verify-full": "VERIFY_IDENTITY",
        }
        if value.lower() not in modes:
            raise Refused(f"URL parameter sslMode: unknown mode {value!r}")
        url.ssl_mode = modes[value.lower()]
    elif name in ("connecttimeout", "logintimeout"):
        url.connect_timeout = _seconds(key, value) or CONNECT_TIMEOUT
    elif name == "sockettimeout":
        url.socket_timeout = _seconds(key, value) or SOCKET_TIMEOUT
    elif name in ("characterencoding", "charset"):
        charset = CHARSETS.get(value.lower())
        if charset is None:
            url.warnings.append(f"characterEncoding={value} is not known: utf8mb4 is used")
        url.charset = charset or "utf8mb4"
    elif name in ("servertimezone", "connectiontimezone", "timezone"):
        url.time_zone = _zone(value)
    elif name in ("allowloadlocalinfile", "allowlocalinfile"):
        url.local_infile = _true(value)
    elif name == "tinyint1isbit":
        url.tiny_int1_is_bit = _true(value)
    elif name == "zerodatetimebehavior":
        behaviours = {"converttonull": "null", "round": "round", "exception": "exception"}
        url.zero_dates = behaviours.get(value.replace("_", "").lower(), "null")
    elif name not in QUIET:
        url.warnings.append(f"URL parameter {key} has no effect here")


def _zone(value: str) -> str:
    """A session ``time_zone``: UTC and GMT as offsets (servers without zone tables know
    them), other names as given (the server must know them)."""
    if value.upper() in ("UTC", "GMT", "Z", "ETC/UTC"):
        return "+00:00"
    if not re.fullmatch(r"[A-Za-z0-9_+\-:/]{1,64}", value):
        raise Refused(f"URL parameter serverTimezone: {value!r} is not a time zone")
    return value


def check_target(url: MySqlUrl, named: bool = False) -> None:
    """Refused unless the admin's allow-list has the URL's host, port and database (a named
    connection is the admin's own choice and needs none). The engine's database is
    PostgreSQL: a MySQL URL is never it."""
    if named:
        return
    allowed = settings.ENGINE["connectors.jdbc-allowed"]
    port = str(url.port)
    if not any(_pattern_matches(p, url.host, port, url.database) for p in allowed):
        raise Refused(
            f"{url.host}:{port}/{url.database} is not allowed for jobs (engine.connectors"
            f".jdbc-allowed: {', '.join(allowed) or 'nothing'}); ask an admin for a named "
            "connection"
        )
