"""What a pgJDBC URL (and a Jdbc block's ``properties``) means to libpq, Keel's client.

pgJDBC takes its settings as URL parameters (``?currentSchema=x&sslmode=require``). Those with
a libpq meaning become libpq's; the driver's own (``loggerLevel``, ``stringtype``,
``reWriteBatchedInserts``, ...) have none and are accepted with a warning that names each, as
are parameters this list does not know. File paths (``sslcert``, ``sslkey``, ``sslrootcert``)
must lie inside the configured file roots: a job never makes a worker read another file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.connectors.jdbc_url import JdbcUrl, parse_jdbc_url

SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: pgJDBC's ``targetServerType`` as libpq's ``target_session_attrs``.
TARGET_SERVER_TYPES = {
    "any": "any",
    "primary": "primary",
    "master": "primary",
    "secondary": "standby",
    "slave": "standby",
    "preferSecondary": "prefer-standby",
    "preferSlave": "prefer-standby",
    "preferPrimary": "any",
}
#: Certificate and key files: allowed inside the file roots only.
FILE_PARAMS = {"sslcert": "sslcert", "sslkey": "sslkey", "sslrootcert": "sslrootcert"}
#: pgJDBC settings without a libpq meaning, and why they change nothing here.
NO_EFFECT = {
    "ApplicationName": "Keel names its sessions itself (its fences find them by name)",
    "socketTimeout": "sink sessions have their own statement and idle timeouts",
    "stringtype": "Keel casts text to each column's type itself",
    "reWriteBatchedInserts": "batches are written with COPY",
    "loggerLevel": "a pgJDBC logging setting",
    "loggerFile": "a pgJDBC logging setting",
    "preferQueryMode": "a pgJDBC protocol setting",
    "prepareThreshold": "a pgJDBC statement-cache setting",
    "preparedStatementCacheQueries": "a pgJDBC statement-cache setting",
    "preparedStatementCacheSizeMiB": "a pgJDBC statement-cache setting",
    "binaryTransfer": "rows move with binary COPY anyway",
    "defaultRowFetchSize": "each split is read with one binary COPY",
    "autosave": "a pgJDBC transaction setting",
    "readOnly": "source sessions are always read-only, sink sessions write",
    "sslfactory": "a Java class: use sslmode and the certificate parameters",
    "sslhostnameverifier": "a Java class: sslmode=verify-full checks the host name",
    "sslpasswordcallback": "a Java class: give sslpassword",
    "loadBalanceHosts": "hosts are tried in order",
    "assumeMinServerVersion": "a pgJDBC protocol setting",
}


@dataclass
class PgTarget:
    """The libpq parameters of a URL (host and port as comma lists, one entry per host), the
    credentials it carries, and a warning per parameter with no effect: (parameter, why)."""

    libpq: dict[str, str]
    user: str = ""
    password: str = ""
    warnings: list[tuple[str, str]] = field(default_factory=list)


def pg_target(url: str, properties: dict | None = None, database: str = "") -> PgTarget:
    """The URL (and ``properties``, which its own parameters override, as in pgJDBC) for
    libpq; ``database`` stands in when the URL names none. ValueError says what is wrong
    (engine.connectors.boundaries checks what the parameters reach: hosts, files)."""
    try:
        parsed = parse_jdbc_url(url)
    except ValueError as exc:
        raise ValueError(f"not a valid PostgreSQL URL: {exc}") from None
    if parsed.subprotocol not in ("postgresql", "postgres"):
        raise ValueError(
            "only PostgreSQL URLs are supported (jdbc:postgresql://host:port/database)"
        )
    if not parsed.hosts or any(h.startswith("/") for h, _ in parsed.hosts):
        raise ValueError("the URL must name a host (jdbc:postgresql://host:port/database)")
    given = [(str(k), _text(v)) for k, v in (properties or {}).items()] + list(parsed.params)
    target = PgTarget(libpq=_hosts(parsed), user=parsed.userinfo[0], password=parsed.userinfo[1])
    target.libpq["dbname"] = parsed.database or database
    for key, value in given:
        _apply(target, key, value)
    if not target.libpq["dbname"]:
        target.libpq["dbname"] = target.user
    if not target.libpq["dbname"]:
        raise ValueError("the URL must name a database (jdbc:postgresql://host:port/database)")
    return target


def _text(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _hosts(parsed: JdbcUrl) -> dict[str, str]:
    hosts = ",".join(h for h, _ in parsed.hosts)
    ports = [p for _, p in parsed.hosts]
    if len(ports) == 1:
        return {"host": hosts, "port": ports[0]} if ports[0] else {"host": hosts}
    return {"host": hosts, "port": ",".join(p or "5432" for p in ports)}


def _apply(target: PgTarget, key: str, value: str) -> None:
    """One pgJDBC parameter onto the target (ValueError when its value cannot be used)."""
    libpq = target.libpq
    if key == "user":
        target.user = value
    elif key == "password":
        target.password = value
    elif key == "currentSchema":
        libpq["search_path"] = value
    elif key == "options":
        libpq["options"] = value
    elif key == "sslmode":
        if value not in SSL_MODES:
            raise ValueError(f"URL parameter sslmode must be one of {', '.join(SSL_MODES)}")
        libpq["sslmode"] = value
    elif key == "ssl":
        if value.lower() == "true":
            libpq.setdefault("sslmode", "verify-full")  # pgJDBC's meaning of ssl=true
    elif key in FILE_PARAMS:  # a path the boundaries resolve inside the file roots
        libpq[FILE_PARAMS[key]] = value
    elif key == "sslpassword":
        libpq["sslpassword"] = value
    elif key in ("connectTimeout", "loginTimeout"):
        if not value.isdigit():
            raise ValueError(f"URL parameter {key} must be a number of seconds")
        if value == "0":  # pgJDBC's "wait forever": a planning step must not hang
            target.warnings.append((key, "0 (no limit) is not taken: 5 s"))
        elif key == "connectTimeout" or "connect_timeout" not in libpq:
            libpq["connect_timeout"] = value
    elif key == "targetServerType":
        if value not in TARGET_SERVER_TYPES:
            known = ", ".join(TARGET_SERVER_TYPES)
            raise ValueError(f"URL parameter targetServerType must be one of {known}")
        libpq["target_session_attrs"] = TARGET_SERVER_TYPES[value]
        if value == "preferPrimary":
            target.warnings.append((key, "libpq has no preferPrimary: any server is used"))
    elif key == "tcpKeepAlive":
        libpq["keepalives"] = "1" if value.lower() == "true" else "0"
    elif key in NO_EFFECT:
        target.warnings.append((key, f"no effect: {NO_EFFECT[key]}"))
    else:
        target.warnings.append((key, "no effect: not a pgJDBC parameter Keel knows"))


def options_text(libpq: dict[str, str], keel_options: str = "") -> str:
    """The session's ``options``: the URL's own first, then ``search_path`` (currentSchema),
    then Keel's, which win where they set the same thing (read-only, timeouts)."""
    parts = [libpq.get("options", "")]
    if libpq.get("search_path"):
        parts.append("-c search_path=" + _escaped(libpq["search_path"]))
    parts.append(keel_options)
    return " ".join(p for p in parts if p)


def _escaped(value: str) -> str:
    """A value inside libpq's ``options``: spaces and backslashes escaped."""
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


#: libpq parameters a session takes from the URL, beside host, port and dbname.
SESSION_KEYS = (
    "sslmode",
    "sslcert",
    "sslkey",
    "sslrootcert",
    "sslpassword",
    "target_session_attrs",
    "keepalives",
)


#: A job's sessions notice a dead link in about half a minute, not hours (an idle one by TCP
#: keepalives, one with data in flight by ``tcp_user_timeout``): slower than the engine's own
#: sessions, as a job's database may be far and slow (docs/decisions/0037).
LINK_CHECKS = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}


def session_params(libpq: dict[str, str], keel_options: str = "") -> dict[str, str]:
    """The parameters psycopg and ADBC sessions both take: the URL's (a connect timeout of 5 s
    unless it gives one), the link checks (keepalives off only if the URL says
    ``tcpKeepAlive=false``) and the combined ``options``."""
    params = {**LINK_CHECKS, **{k: libpq[k] for k in SESSION_KEYS if libpq.get(k)}}
    params["connect_timeout"] = libpq.get("connect_timeout") or "5"
    options = options_text(libpq, keel_options)
    if options:
        params["options"] = options
    return params
