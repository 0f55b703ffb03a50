"""``GET /metrics`` while PostgreSQL cannot be reached: a scraper with the bearer token still
gets a 200 reading ``keel_database_up 0`` (so an alert tells "database down" from "web down",
which a failed scrape would be), a token that needs the database to be checked gets a 503, and
the next scrape after the database is back reads 1 with the whole exposition.

The web's connection is pointed at a port nothing listens on (connection refused, as for a
stopped server) rather than stopping the shared test server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from rest_framework.authtoken.models import Token

from tests.clusterkit import free_port
from tests.conftest import role_user
from tests.test_metrics import scrape, value

pytestmark = pytest.mark.django_db(transaction=True)
REMOTE = {"REMOTE_ADDR": "203.0.113.9"}


@contextlib.contextmanager
def unreachable_database() -> Iterator[None]:
    """The default connection's server is a closed port until the block ends."""
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


def test_the_scrape_token_reads_database_down_without_the_database(client):
    viewer = Token.objects.create(user=role_user("vera", "viewer"))
    bearer = {"HTTP_AUTHORIZATION": "Bearer s3cret-scrape", **REMOTE}
    options = {**settings.ENGINE, "metrics.loopback": False, "metrics.token": "s3cret-scrape"}
    with override_settings(ENGINE=options):
        with unreachable_database():
            down = scrape(client, **bearer)
            assert down == {("keel_database_up", ()): 0}
            refused = client.get("/metrics", HTTP_AUTHORIZATION=f"Token {viewer.key}", **REMOTE)
            assert refused.status_code == 503
            assert b"database is unreachable" in refused.content
        up = scrape(client, **bearer)
    assert value(up, "keel_database_up") == 1
    assert value(up, "keel_master_active") == 0
