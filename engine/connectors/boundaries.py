"""Where a job's connectors may reach, as the admin configured it (never the job):
``engine.connectors.file-roots`` for LocalFile, ``engine.connectors.jdbc-allowed`` for Jdbc. The
engine's own database is always refused. Checked when a job is planned, and again by the worker
before it opens anything."""

from __future__ import annotations

import fnmatch
import ipaddress
from pathlib import Path

from django.conf import settings

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


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


def parse_url(url: str, properties: dict | None = None, database: str = "") -> dict[str, str]:
    """A job's PostgreSQL URL (pgJDBC's form, ``jdbc:`` prefix allowed; ``properties`` beside
    it) as libpq parameters (engine.connectors.pg_url); Refused if it is not one, names no
    host, or names a certificate file outside the file roots."""
    from engine.connectors.pg_url import FILE_PARAMS, pg_target

    try:
        params = pg_target(url, properties, database).libpq
    except ValueError as exc:
        raise Refused(str(exc)) from None
    for key in FILE_PARAMS.values():  # certificate files: inside the file roots only
        if key in params:
            try:
                params[key] = str(resolve_file_path(params[key]))
            except Refused as exc:
                raise Refused(f"URL parameter {key}: {exc}") from None
    return params


def endpoints(params: dict[str, str]) -> list[tuple[str, str]]:
    """(host, port) of every host of libpq ``params`` (port "5432" when none is given; one
    port given is every host's, as libpq reads it)."""
    hosts = params["host"].split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return [(h, (ports[i] if i < len(ports) else "") or "5432") for i, h in enumerate(hosts)]


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
    """Whether any host of ``params`` is any host of the engine's own database (it may name
    several: a primary and its standbys)."""
    engine = settings.DATABASES["default"]
    ours = endpoints(
        {"host": str(engine.get("HOST") or "localhost"), "port": str(engine.get("PORT") or "")}
    )
    return params.get("dbname") == engine["NAME"] and any(
        port == engine_port and (_same_host(host, engine_host) or engine_host.startswith("/"))
        for host, port in endpoints(params)
        for engine_host, engine_port in ours
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


def check_database(
    url: str, named: bool = False, properties: dict | None = None, database: str = ""
) -> dict[str, str]:
    """Refused unless ``url`` is a database jobs may use: every host on the allow-list (a
    named connection is the admin's own choice and needs none) and never the engine's own
    database."""
    params = parse_url(url, properties, database)
    if is_engine_database(params):
        raise Refused("the engine's own database is never available to jobs")
    if named:
        return params
    dbname = params["dbname"]
    allowed = settings.ENGINE["connectors.jdbc-allowed"]
    for host, port in endpoints(params):
        if not any(_pattern_matches(p, host, port, dbname) for p in allowed):
            raise Refused(
                f"{host}:{port}/{dbname} is not allowed for jobs (engine.connectors.jdbc-allowed: "
                f"{', '.join(allowed) or 'nothing'}); ask an admin for a named connection"
            )
    return params
