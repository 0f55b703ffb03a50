"""``DATABASE_URL`` may name one host (read by dj-database-url) or several in libpq's own form,
so that the engine follows a promoted standby; either way its query parameters reach libpq as
connection options, and only libpq's keywords among Django's OPTIONS reach a dedicated
session."""

from __future__ import annotations

from engine.dbsession import _url_options
from keel.dburl import database_settings


def test_a_single_host_url_is_read_by_dj_database_url():
    """The single-host form keeps what it always gave, query parameters as options."""
    db = database_settings("postgres://keel:pw@db.example:6543/keel?sslmode=require")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["NAME"], db["HOST"], str(db["PORT"])) == ("keel", "db.example", "6543")
    assert (db["USER"], db["PASSWORD"]) == ("keel", "pw")
    assert db["OPTIONS"] == {"sslmode": "require"}
    assert db["CONN_MAX_AGE"] == 0


def test_a_single_host_url_without_a_query_has_empty_options():
    """settings.py merges into OPTIONS, so it must exist even when the URL gives none."""
    db = database_settings("postgres://postgres@127.0.0.1:5432/keel")
    assert db["OPTIONS"] == {}
    assert (db["HOST"], str(db["PORT"]), db["NAME"]) == ("127.0.0.1", "5432", "keel")


def test_a_multi_host_url_gives_libpq_its_host_and_port_lists():
    """Django passes HOST and PORT to libpq unchanged: comma lists, in the URL's order."""
    db = database_settings(
        "postgres://postgres@10.0.0.1:5001,10.0.0.2:5002/keel?target_session_attrs=read-write"
    )
    assert db["HOST"] == "10.0.0.1,10.0.0.2"
    assert db["PORT"] == "5001,5002"
    assert (db["NAME"], db["USER"]) == ("keel", "postgres")
    assert db["OPTIONS"] == {"target_session_attrs": "read-write"}
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert db["CONN_MAX_AGE"] == 0


def test_a_multi_host_url_keeps_a_host_without_a_port_in_its_place():
    """libpq pairs ports with hosts by position: a host with no port keeps an empty slot."""
    db = database_settings("postgres://u@h1,h2:5433/keel?sslmode=disable")
    assert (db["HOST"], db["PORT"]) == ("h1,h2", ",5433")
    assert db["OPTIONS"] == {"sslmode": "disable"}


def test_a_dedicated_session_takes_only_libpq_keywords_from_options():
    """Django's own OPTIONS (a pool, an isolation level) are not libpq's and would make
    psycopg.connect fail; the URL's libpq keywords must pass."""
    opts = {
        "target_session_attrs": "read-write",
        "sslmode": "require",
        "pool": True,
        "isolation_level": 1,
        "server_side_binding": True,
    }
    assert _url_options(opts) == {"target_session_attrs": "read-write", "sslmode": "require"}
