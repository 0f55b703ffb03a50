"""The example jobs under examples/ and the PostgreSQL database their Jdbc jobs use."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
EXAMPLES_DB = "keel_examples"
#: What ./run demo submits: one of each kind, a few seconds of work or a live stream each.
DEMO_SET = (
    "fake_to_console.streaming.conf",
    "fake_to_localfile.batch.conf",
    "jdbc_to_jdbc.batch.conf",
    "fake_to_jdbc.streaming.conf",
)
ORDERS = 10_000


def example_files() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*.conf"))


def examples_url(database_url: str, name: str = EXAMPLES_DB) -> str:
    """The examples database on the same server as ``database_url``."""
    return urlunsplit(urlsplit(database_url)._replace(path=f"/{name}"))


def prepare_examples_db(database_url: str, name: str = EXAMPLES_DB) -> str:
    """Create the examples database and its tables (idempotent); export its JDBC URL.

    Returns the URL and sets KEEL_EXAMPLES_JDBC_URL, which the example configs read.
    """
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
    jdbc = "jdbc:" + url.replace("postgres://", "postgresql://", 1)
    os.environ["KEEL_EXAMPLES_JDBC_URL"] = jdbc
    return jdbc
