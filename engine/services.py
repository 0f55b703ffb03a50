"""Reaching PostgreSQL and Redis, and saying clearly when they cannot be reached.

Every command checks its services first and, when one is down, prints one line naming the URL
(password masked) and how to start the service, then exits non-zero: never a traceback.
"""

from __future__ import annotations

import sys
from urllib.parse import urlsplit, urlunsplit

from engine.errortext import first_line

EXIT_SERVICE_DOWN = 2

POSTGRES_HINT = (
    "start it (e.g. `pg_ctlcluster --skip-systemctl-redirect 15 main start`) or set DATABASE_URL"
)
REDIS_HINT = "start it (e.g. `redis-server --daemonize yes --port 6379`) or set REDIS_URL"


class ServiceUnavailable(Exception):
    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def url_hosts(url: str) -> str:
    """The hosts of a URL (``h1:5432,h2:5432`` in libpq's multi-host form), without its user
    and password: a password may hold a comma."""
    return urlsplit(url).netloc.rpartition("@")[2]


def names_several_hosts(url: str) -> bool:
    """Whether ``url`` is libpq's multi-host form, which only libpq's own parser reads."""
    return "," in url_hosts(url)


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def postgres_error_line(url: str, exc: BaseException) -> str:
    """The one line shown when PostgreSQL at ``url`` fails with ``exc``."""
    reason = first_line(exc)
    if "does not exist" in reason and "database" in reason:
        return (
            f"error: PostgreSQL at {mask_url(url)} answers, but {reason}: "
            "run `./run` (it creates and migrates the database) or set DATABASE_URL"
        )
    return f"error: cannot reach PostgreSQL at {mask_url(url)} ({reason}): {POSTGRES_HINT}"


def redis_error_line(url: str, exc: BaseException) -> str:
    return f"error: cannot reach Redis at {mask_url(url)} ({first_line(exc)}): {REDIS_HINT}"


def check_postgres(url: str, timeout: float = 3.0, display_url: str | None = None) -> None:
    """Connect once to ``url``; errors name ``display_url`` (the URL the user configured)."""
    import psycopg

    parts = urlsplit(url)
    try:
        if names_several_hosts(url):
            conn = psycopg.connect(url, connect_timeout=max(int(timeout), 1))
            conn.close()
            return
        conn = psycopg.connect(
            host=parts.hostname or None,
            port=parts.port or None,
            dbname=parts.path.lstrip("/") or None,
            user=parts.username or None,
            password=parts.password or None,
            connect_timeout=max(int(timeout), 1),
        )
    except psycopg.Error as exc:
        raise ServiceUnavailable(postgres_error_line(display_url or url, exc)) from None
    conn.close()


def check_redis(url: str, timeout: float = 3.0) -> None:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        client.ping()
        client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise ServiceUnavailable(redis_error_line(url, exc)) from None


def require_services(*, postgres: bool = True, redis: bool = True) -> None:
    """Check the configured services; print one line and exit non-zero if one is down."""
    from django.conf import settings

    try:
        if postgres:
            check_postgres(settings.DATABASE_URL)
        if redis:
            check_redis(settings.REDIS_URL)
    except ServiceUnavailable as exc:
        print(exc.line, file=sys.stderr)
        sys.exit(EXIT_SERVICE_DOWN)
