"""The engine's database may name several hosts (a primary and its standbys): a job's URL
pointing at any of them is the engine's own database and is refused; and a single port given
for several hosts is every host's, as libpq reads it."""

from __future__ import annotations

import pytest

from engine.connectors.boundaries import endpoints, is_engine_database

#: A new DATABASES (never the shared dict changed in place) leaves the open connections on the
#: old one, which is what these tests want: only boundaries reads it, and none connects.
pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES:UserWarning")


@pytest.fixture
def engine_hosts(settings):
    """The engine's database on two hosts, each with its own port (a copy of the entry, which
    the settings fixture puts back)."""
    settings.DATABASES = {
        **settings.DATABASES,
        "default": {
            **settings.DATABASES["default"],
            "HOST": "10.0.0.1,10.0.0.2",
            "PORT": "5001,5002",
            "NAME": "keel",
        },
    }


def test_one_port_is_every_hosts_port():
    assert endpoints({"host": "a,b,c", "port": "6000"}) == [
        ("a", "6000"),
        ("b", "6000"),
        ("c", "6000"),
    ]


def test_ports_pair_with_hosts_by_position_and_default_to_5432():
    assert endpoints({"host": "a,b", "port": "6000,6001"}) == [("a", "6000"), ("b", "6001")]
    assert endpoints({"host": "a,b", "port": ",6001"}) == [("a", "5432"), ("b", "6001")]
    assert endpoints({"host": "a,b"}) == [("a", "5432"), ("b", "5432")]


def test_a_job_url_at_any_of_the_engines_hosts_is_the_engines_database(engine_hosts):
    assert is_engine_database({"host": "10.0.0.1", "port": "5001", "dbname": "keel"})
    assert is_engine_database({"host": "10.0.0.2", "port": "5002", "dbname": "keel"})
    assert is_engine_database({"host": "192.0.2.9,10.0.0.2", "port": "5432,5002", "dbname": "keel"})


def test_another_port_or_database_on_the_engines_hosts_is_not(engine_hosts):
    """A host is the engine's only with its own port: the standby's port on the primary is
    another server."""
    assert not is_engine_database({"host": "10.0.0.1", "port": "5002", "dbname": "keel"})
    assert not is_engine_database({"host": "10.0.0.2", "port": "5002", "dbname": "data"})
    assert not is_engine_database({"host": "10.0.0.3", "port": "5001", "dbname": "keel"})


def test_one_engine_port_covers_every_engine_host(settings):
    settings.DATABASES = {
        **settings.DATABASES,
        "default": {**settings.DATABASES["default"], "HOST": "h1,h2", "PORT": "6000", "NAME": "k"},
    }
    assert is_engine_database({"host": "h2", "port": "6000", "dbname": "k"})
    assert not is_engine_database({"host": "h2", "port": "5432", "dbname": "k"})
