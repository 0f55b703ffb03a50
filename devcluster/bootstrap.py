"""Setup steps behind ``./run``: create the database, and start embedded services for the demo.

Runs without Django (it must work before the database exists):
    python -m devcluster.bootstrap createdb       create the database named by DATABASE_URL
                                                  if missing
    python -m devcluster.bootstrap migrated       exit 0 if every migration of Keel's own apps
                                                  is recorded there already (``migrate`` is a
                                                  no-op then, and costs seconds)
    python -m devcluster.bootstrap embedded-env   print ``export`` lines for private
                                                  PostgreSQL/Redis under .var/ when nothing
                                                  answers at the defaults
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from engine.services import (
    EXIT_SERVICE_DOWN,
    ServiceUnavailable,
    check_postgres,
    check_redis,
    mask_url,
    names_several_hosts,
)

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("KEEL_VAR_DIR", ROOT / ".var"))
# Where the defaults are looked for, and the embedded ports (overridable for tests).
DEFAULT_DATABASE_URL = os.environ.get("KEEL_DEFAULT_DATABASE_URL", "postgres://127.0.0.1:5432/keel")
DEFAULT_REDIS_URL = os.environ.get("KEEL_DEFAULT_REDIS_URL", "redis://127.0.0.1:6379/0")
EMBEDDED_PG_PORT = int(os.environ.get("KEEL_EMBEDDED_PG_PORT", "54329"))
EMBEDDED_REDIS_PORT = int(os.environ.get("KEEL_EMBEDDED_REDIS_PORT", "63799"))


def createdb(url: str) -> None:
    """Create the database of ``url`` if it does not exist (connecting to ``postgres``)."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name:
        raise ServiceUnavailable(f"error: DATABASE_URL {mask_url(url)} names no database")
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    check_postgres(maintenance, display_url=url)
    if names_several_hosts(url):  # libpq reads it (and finds the primary)
        multi = psycopg.connect(
            maintenance, autocommit=True, connect_timeout=3, target_session_attrs="read-write"
        )
        with multi as conn:
            _create(conn, name)
        return
    with psycopg.connect(
        host=parts.hostname,
        port=parts.port,
        dbname="postgres",
        user=parts.username,
        password=parts.password,
        autocommit=True,
        connect_timeout=3,
    ) as conn:
        _create(conn, name)


def _create(conn, name: str) -> None:
    import psycopg
    from psycopg import sql

    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
        return
    try:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        print(f"created database {name}", file=sys.stderr)
    except psycopg.errors.DuplicateDatabase:
        pass


#: Keel's own apps: Django's are migrated in the same ``migrate`` run as these.
OWN_APPS = ("engine", "history", "dashboard")


def migrated(url: str) -> bool:
    """Whether the database already records every migration file of Keel's own apps."""
    import psycopg

    wanted = {
        (app, path.stem)
        for app in OWN_APPS
        for path in (ROOT / app / "migrations").glob("[0-9]*.py")
    }
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            rows = conn.execute(
                "SELECT app, name FROM django_migrations WHERE app = ANY(%s)", (list(OWN_APPS),)
            ).fetchall()
    except psycopg.Error:
        return False  # no such table yet, or no database: migrate says what is wrong
    return wanted <= set(rows)


def _answers_postgres(url: str) -> bool:
    try:
        check_postgres(urlunsplit(urlsplit(url)._replace(path="/postgres")), timeout=2)
        return True
    except ServiceUnavailable:
        return False


def _answers_redis(url: str) -> bool:
    try:
        check_redis(url, timeout=2)
        return True
    except ServiceUnavailable:
        return False


def find_pg_program(program: str) -> str | None:
    """The newest installed PostgreSQL's own binary, else whatever PATH has."""
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{program}"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
        reverse=True,
    )
    return candidates[0] if candidates else shutil.which(program)


def as_postgres_user(argv: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: drop to the postgres user when we are root."""
    if os.geteuid() == 0 and shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def start_embedded_postgres() -> str:
    initdb, pg_ctl = find_pg_program("initdb"), find_pg_program("pg_ctl")
    if not initdb or not pg_ctl:
        raise ServiceUnavailable(
            "error: PostgreSQL is not answering and its server programs "
            "are not installed: install postgresql or set DATABASE_URL"
        )
    data = VAR / "postgres"
    url = f"postgres://postgres@127.0.0.1:{EMBEDDED_PG_PORT}/keel"
    if _answers_postgres(url):
        return url
    VAR.mkdir(parents=True, exist_ok=True)
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(data, user="postgres")
        subprocess.run(
            as_postgres_user(
                [
                    initdb,
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    log = data / "server.log"
    subprocess.run(
        as_postgres_user(
            [
                pg_ctl,
                "-D",
                str(data),
                "-l",
                str(log),
                "-w",
                "-o",
                f"-p {EMBEDDED_PG_PORT} -k {data} -c listen_addresses=127.0.0.1",
                "start",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return url


def start_embedded_redis() -> str:
    server = shutil.which("redis-server")
    if not server:
        raise ServiceUnavailable(
            "error: Redis is not answering and redis-server is not "
            "installed: install redis or set REDIS_URL"
        )
    url = f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0"
    if _answers_redis(url):
        return url
    directory = VAR / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            server,
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "--port",
            str(EMBEDDED_REDIS_PORT),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
            "--logfile",
            str(directory / "redis.log"),
        ],
        check=True,
    )
    deadline = time.monotonic() + 10
    while not _answers_redis(url):
        if time.monotonic() > deadline:
            raise ServiceUnavailable(f"error: embedded Redis did not start; see {directory}")
        time.sleep(0.1)
    return url


def embedded_env() -> list[str]:
    """``export`` lines for services that had to be started privately (none if defaults work)."""
    lines, started = [], []
    if "DATABASE_URL" not in os.environ and not _answers_postgres(DEFAULT_DATABASE_URL):
        lines.append(f"export DATABASE_URL={start_embedded_postgres()}")
        started.append("postgres")
        print(
            "PostgreSQL was not answering: started a private one under .var/postgres",
            file=sys.stderr,
        )
    if "REDIS_URL" not in os.environ and not _answers_redis(DEFAULT_REDIS_URL):
        lines.append(f"export REDIS_URL={start_embedded_redis()}")
        started.append("redis")
        print("Redis was not answering: started a private one under .var/redis", file=sys.stderr)
    if started:
        lines.append(f"export KEEL_EMBEDDED_STARTED='{' '.join(started)}'")
    return lines


def stop_embedded(started: list[str]) -> None:
    """Stop the private services this run started (the demo stops everything it started)."""
    if "postgres" in started and (pg_ctl := find_pg_program("pg_ctl")):
        subprocess.run(
            as_postgres_user([pg_ctl, "-D", str(VAR / "postgres"), "-m", "fast", "-w", "stop"]),
            stdout=subprocess.DEVNULL,
            check=False,
        )
    if "redis" in started:
        import redis

        with contextlib.suppress(redis.RedisError):
            redis.Redis(host="127.0.0.1", port=EMBEDDED_REDIS_PORT).shutdown(nosave=True)


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["createdb"]:
            createdb(os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL))
            check_redis(os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
        elif argv[:1] == ["migrated"]:
            return 0 if migrated(os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)) else 1
        elif argv[:1] == ["embedded-env"]:
            print("\n".join(embedded_env()))
        elif argv[:1] == ["stop-embedded"]:
            stop_embedded(argv[1:])
        else:
            print(__doc__, file=sys.stderr)
            return 64
    except ServiceUnavailable as exc:
        print(exc.line, file=sys.stderr)
        return EXIT_SERVICE_DOWN
    except subprocess.CalledProcessError as exc:
        print(f"error: could not start an embedded service: {exc}", file=sys.stderr)
        return EXIT_SERVICE_DOWN
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
