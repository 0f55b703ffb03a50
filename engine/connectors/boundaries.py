"""Where a job's connectors may reach, as the admin configured it (never the job):
``engine.connectors.file-roots`` for LocalFile, ``engine.connectors.jdbc-allowed`` for Jdbc. The
engine's own database is always refused. Checked when a job is planned, and again by the worker
before it opens anything."""

from __future__ import annotations

import fnmatch
import ipaddress
from pathlib import Path

from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
#: libpq parameters a job's URL may carry: anything else (passfile, service, sslkey, ...)
#: would reach files or settings of the process running the job.
ALLOWED_URL_PARAMS = {"host", "port", "dbname", "sslmode", "connect_timeout", "application_name"}


class Refused(ValueError):
    """A connector target outside the configured boundaries (the message names it)."""


# -- files --------------------------------------------------------------------------------------


def file_roots() -> list[Path]:
    return [Path(root).resolve() for root in settings.ENGINE["connectors.file-roots"]]


def resolve_file_path(path: str) -> Path:
    """The path with symlinks and ``..`` resolved (relative to the project directory), if it
    lies inside a file root; else Refused."""
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = Path(settings.BASE_DIR) / candidate
    resolved = candidate.resolve()
    roots = file_roots()
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        shown = ", ".join(str(r) for r in roots) or "none"
        raise Refused(
            f"{path} resolves to {resolved}, outside the file roots this cluster allows "
            f"({shown}; engine.connectors.file-roots)"
        )
    return resolved


# -- databases ----------------------------------------------------------------------------------


def parse_url(url: str) -> dict[str, str]:
    """A job's PostgreSQL URL (``jdbc:`` prefix allowed) as libpq parameters; Refused if it is
    not one, names no host, or carries parameters a job may not set."""
    if url.startswith("jdbc:"):
        url = url[len("jdbc:") :]
    if not url.startswith(("postgresql://", "postgres://")):
        raise Refused("only PostgreSQL URLs are supported (jdbc:postgresql://host:port/database)")
    try:
        params = conninfo_to_dict(url)
    except Exception:
        raise Refused("not a valid PostgreSQL URL (jdbc:postgresql://host:port/database)") from None
    if params.get("user") or params.get("password"):
        raise Refused("put credentials in the user and password options, not in the URL")
    extra = sorted(set(params) - ALLOWED_URL_PARAMS)
    if extra:
        raise Refused(f"URL parameter(s) not allowed: {', '.join(extra)}")
    host = str(params.get("host") or "")
    if not host or host.startswith("/") or "," in host:
        raise Refused("the URL must name one host (jdbc:postgresql://host:port/database)")
    if not params.get("dbname"):
        raise Refused("the URL must name a database (jdbc:postgresql://host:port/database)")
    return {k: str(v) for k, v in params.items()}


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _same_host(a: str, b: str) -> bool:
    return a.lower() == b.lower() or (_is_loopback(a) and _is_loopback(b))


def is_engine_database(params: dict[str, str]) -> bool:
    engine = settings.DATABASES["default"]
    engine_host = str(engine.get("HOST") or "localhost")
    engine_port = str(engine.get("PORT") or 5432)
    return (
        params.get("dbname") == engine["NAME"]
        and str(params.get("port") or 5432) == engine_port
        and (_same_host(params["host"], engine_host) or engine_host.startswith("/"))
    )


def _pattern_matches(pattern: str, host: str, port: str, dbname: str) -> bool:
    """``host[:port][/database]``; a part left out matches any; ``*`` globs; ``loopback`` is
    every loopback name and address."""
    address, _, database = pattern.partition("/")
    if address.startswith("["):
        name, _, rest = address[1:].partition("]")
        want_port = rest.lstrip(":")
    elif address.count(":") == 1:
        name, want_port = address.split(":")
    else:
        name, want_port = address, ""
    if name == "loopback":
        host_ok = _is_loopback(host)
    else:
        host_ok = fnmatch.fnmatch(host.lower().strip("[]"), name.lower()) or _same_host(host, name)
    return (
        host_ok
        and (not want_port or fnmatch.fnmatch(port, want_port))
        and (not database or fnmatch.fnmatch(dbname, database))
    )


def check_database(url: str, named: bool = False) -> dict[str, str]:
    """Refused unless ``url`` is a database jobs may use: on the allow-list (a named connection
    is the admin's own choice and needs none) and never the engine's own database."""
    params = parse_url(url)
    if is_engine_database(params):
        raise Refused("the engine's own database is never available to jobs")
    if not named:
        host, port, dbname = params["host"], str(params.get("port") or 5432), params["dbname"]
        allowed = settings.ENGINE["connectors.jdbc-allowed"]
        if not any(_pattern_matches(p, host, port, dbname) for p in allowed):
            raise Refused(
                f"{host}:{port}/{dbname} is not allowed for jobs (engine.connectors.jdbc-allowed: "
                f"{', '.join(allowed) or 'nothing'}); ask an admin for a named connection"
            )
    return params
