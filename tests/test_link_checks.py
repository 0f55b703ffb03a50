"""Every session the engine opens notices a dead link in seconds: TCP keepalives for an idle
link, ``tcp_user_timeout`` for one that dies with data in flight, on both ends of the engine's
own sessions, and on a job's (slower bounds; the URL may turn keepalives off)."""

from __future__ import annotations

from django.db import connection

from engine.connectors import pg
from engine.dbsession import TCP_USER_TIMEOUT_MS, _configure_engine_session, connect_dedicated
from tests.test_jobs_cluster import data_db

__all__ = ["data_db"]


def server_settings(conn) -> tuple:
    return conn.execute(
        "SELECT current_setting('tcp_user_timeout'), current_setting('tcp_keepalives_idle'),"
        " current_setting('tcp_keepalives_count'), current_setting('statement_timeout')"
    ).fetchone()


def test_a_dedicated_engine_session_checks_its_link_on_both_ends():
    with connect_dedicated("keel-test-link") as conn:
        client = conn.info.get_parameters()
        assert client["keepalives"] == "1" and client["keepalives_idle"] == "2"
        assert client["tcp_user_timeout"] == str(TCP_USER_TIMEOUT_MS)
        assert server_settings(conn) == ("5000", "2", "3", "30s")


def test_every_django_session_of_an_engine_process_checks_its_link(db):
    """And bounds every statement, so that one whose answer never comes ends."""
    params = connection.get_connection_params()
    assert params["tcp_user_timeout"] == TCP_USER_TIMEOUT_MS and params["keepalives"] == 1
    _configure_engine_session(None, connection)  # what every new session of an engine process runs
    with connection.cursor() as cur:
        cur.execute(
            "SELECT current_setting('tcp_user_timeout'), current_setting('lock_timeout'),"
            " current_setting('idle_in_transaction_session_timeout'),"
            " current_setting('statement_timeout')"
        )
        assert cur.fetchone() == ("5000", "5s", "1500ms", "30s")


def test_a_jobs_session_checks_its_link_unless_its_url_turns_keepalives_off(data_db, settings):
    url = "jdbc:" + data_db.replace("postgres://", "postgresql://")
    with pg.connect({"url": url, "user": "root", "password": "t"}) as conn:
        client = conn.info.get_parameters()
        assert client["keepalives"] == "1" and client["tcp_user_timeout"] == "30000"
    off = {"url": url + "?tcpKeepAlive=false", "user": "root", "password": "t"}
    with pg.connect(off) as conn:
        client = conn.info.get_parameters()
        assert client["keepalives"] == "0" and client["tcp_user_timeout"] == "30000"
