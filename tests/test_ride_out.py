"""Riding out a database outage once the task group is stopping: the retries back off rather
than spin (a set stop event's ``wait`` returns at once)."""

from __future__ import annotations

import socket
import threading

import psycopg
import pytest

from engine.dbsession import ride_out


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_stopped_task_group_backs_off_while_the_database_is_unreachable():
    port = closed_port()  # nothing listens: every connection is refused at once
    calls = []

    def call():
        calls.append(1)
        psycopg.connect(host="127.0.0.1", port=port, dbname="keel", connect_timeout=1).close()

    stopped = threading.Event()
    stopped.set()
    with pytest.raises(psycopg.OperationalError):
        ride_out(call, "reporting", wait=stopped.wait, tolerance=1.5)
    # Backoff 0.1, 0.2, 0.4, 0.8 s: a handful of tries, not thousands.
    assert 2 <= len(calls) <= 8
