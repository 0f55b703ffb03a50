"""The example jobs under examples/ and the PostgreSQL database their Jdbc jobs use."""

from __future__ import annotations

import getpass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from engine.services import names_several_hosts, url_hosts

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
EXAMPLES_DB = "keel_examples"
EXAMPLES_CONNECTION = "examples"
#: What ./run demo submits: one of each kind, a few seconds of work or a live stream each.
DEMO_SET = (
    "fake_to_console.streaming.conf",
    "fake_to_localfile.batch.conf",
    "jdbc_to_jdbc.batch.conf",
    "fake_to_jdbc.streaming.conf",
    "tracked_stream.streaming.conf",
)
ORDERS = 10_000


def example_files() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*.conf"))


def examples_url(database_url: str, name: str = EXAMPLES_DB) -> str:
    """The examples database on the same server as ``database_url``."""
    return urlunsplit(urlsplit(database_url)._replace(path=f"/{name}"))


def prepare_examples_db(database_url: str, name: str = EXAMPLES_DB) -> str:
    """Create the examples database and its tables (idempotent); return its JDBC URL.

    The example configs name the connection ``examples`` (see ``save_examples_connection``)."""
    url = examples_url(database_url, name)
    admin = urlunsplit(urlsplit(database_url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, customer text, "
            "amount double precision)"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS order_report (order_id bigint PRIMARY KEY, "
            "customer text, total double precision)"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS fake_stream (id bigint PRIMARY KEY, name text, "
            "value double precision)"
        )
        conn.execute(
            "INSERT INTO orders SELECT g, 'customer-' || (g %% 97), round((g %% 1000) * 1.5, 2) "
            "FROM generate_series(1, %s) g ON CONFLICT (id) DO NOTHING",
            (ORDERS,),
        )
    parts = urlsplit(url)
    hosts = url_hosts(url)  # every host of a multi-host URL, as written
    if not names_several_hosts(url):
        hosts = f"{parts.hostname}:{parts.port or 5432}"
        return "jdbc:" + urlunsplit(parts._replace(scheme="postgresql", netloc=hosts, query=""))
    # pgJDBC's name for libpq's target_session_attrs=read-write: the primary, never a standby.
    primary = parts._replace(scheme="postgresql", netloc=hosts, query="targetServerType=primary")
    return "jdbc:" + urlunsplit(primary)


def save_examples_connection(jdbc_url: str, database_url: str) -> None:
    """Store the named connection ``examples`` the example configs use (what an admin would
    do in the admin). Its user and password are the engine database's, or this OS user with a
    placeholder password where the server trusts local connections."""
    from engine.models import Connection

    parts = urlsplit(database_url)
    connection, _ = Connection.objects.get_or_create(
        name=EXAMPLES_CONNECTION, defaults={"url": jdbc_url}
    )
    connection.url = jdbc_url
    connection.user = parts.username or getpass.getuser()
    connection.description = "the example jobs' database (./run demo)"
    connection.set_password(parts.password or "local-trust")
    connection.save()
