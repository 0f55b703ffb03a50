"""A partition leaves Redis connections half-open: the broker's sockets must check their link
(keepalives, TCP_USER_TIMEOUT), and the Celery consumer must try to reconnect every second at
most, not back off to kombu's 30 s, so a member hears commands again soon after it heals."""

from __future__ import annotations

import socket
import time

import pytest
from kombu import Connection
from kombu.exceptions import OperationalError

from keel.celery import app
from keel.celery_consumer import PromptConsumer
from tests.clusterkit import lane_redis_url


def test_the_brokers_redis_connections_check_their_link():
    """Both what redis-py is told and what the kernel then holds on the socket."""
    conn = app.connection_for_read()
    try:
        pool = conn.default_channel.client.connection_pool
        kwargs = pool.connection_kwargs
        assert kwargs["socket_keepalive"] is True
        assert kwargs["socket_keepalive_options"][socket.TCP_USER_TIMEOUT] == 5000
        redis_conn = pool.get_connection()
        try:
            redis_conn.connect()
            sock = redis_conn._sock
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 5000
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
        finally:
            pool.release(redis_conn)
    finally:
        conn.release()


def test_the_worker_uses_the_prompt_consumer():
    assert app.conf.worker_consumer == "keel.celery_consumer:PromptConsumer"


def consumer_like() -> PromptConsumer:
    """What ensure_connected reads of a consumer, without building one (a whole worker's
    blueprint): the app and its two retry counters."""
    consumer = PromptConsumer.__new__(PromptConsumer)
    consumer.app = app
    consumer.first_connection_attempt = True
    consumer.broker_connection_retry_attempt = 0
    return consumer


def recording(conn: Connection, calls: list[dict], waits: list[float] | None = None) -> None:
    """Wrap ``conn.ensure_connection`` to record the keywords it is called with; with
    ``waits``, also kombu's real wait before each new attempt, and three attempts at most (a
    broker that is down then fails the test in seconds)."""
    real = conn.ensure_connection

    def ensure_connection(errback=None, max_retries=None, **kwargs):
        calls.append(kwargs)
        if waits is None:
            return real(errback, max_retries, **kwargs)

        def noting(exc, interval):
            waits.append(interval)
            return errback(exc, interval)

        return real(noting, 3, **kwargs)

    conn.ensure_connection = ensure_connection


def test_the_consumer_connects_with_a_backoff_of_a_second_at_most():
    calls: list[dict] = []
    with Connection(lane_redis_url("tests")) as conn:
        recording(conn, calls)
        assert PromptConsumer.ensure_connected(consumer_like(), conn) is conn
        assert conn.connected
    assert len(calls) == 1 and calls[0]["interval_max"] <= 1
    assert calls[0]["interval_start"] <= calls[0]["interval_max"]


def test_a_broker_that_is_down_is_tried_again_within_a_second():
    """kombu's own errback sees the real waits between attempts."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    waits: list[float] = []
    calls: list[dict] = []
    with Connection(f"redis://127.0.0.1:{port}/0") as conn:
        recording(conn, calls, waits)
        started = time.monotonic()
        with pytest.raises(OperationalError):
            PromptConsumer.ensure_connected(consumer_like(), conn)
        elapsed = time.monotonic() - started
    assert len(calls) == 1 and calls[0]["interval_max"] <= 1
    assert len(waits) == 3 and all(0 < w <= 1 for w in waits), waits
    assert elapsed < 5, elapsed  # kombu's defaults would wait 2 + 4 + 6 s
