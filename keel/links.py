"""How every Redis connection of the engine checks its link (docs/decisions/0037).

A partition leaves a TCP connection half-open. A socket timeout bounds a blocking call, but
Celery's consumer waits on its socket in an event loop, where no call times out: its BRPOP
stays sent, and when the link heals, TCP's retransmission backoff (doubling from 200 ms) may
keep it quiet for many seconds more. ``TCP_USER_TIMEOUT`` ends a connection whose data stays
unacknowledged for 5 s, and keepalives probe an idle one, so the consumer reconnects (within a
second: keel.celery_consumer) instead of waiting on a dead link.
"""

from __future__ import annotations

import socket

#: setsockopt(IPPROTO_TCP, ...) options of every Redis connection (redis-py's
#: ``socket_keepalive_options``): keepalives after 2 s idle, every second, 3 probes; and 5 s
#: for data in flight.
REDIS_KEEPALIVE_OPTIONS = {
    getattr(socket, name): value
    for name, value in (
        ("TCP_KEEPIDLE", 2),
        ("TCP_KEEPINTVL", 1),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", 5000),
    )
    if hasattr(socket, name)  # Linux's; another system keeps what it has
}
REDIS_LINK_CHECKS = {"socket_keepalive": True, "socket_keepalive_options": REDIS_KEEPALIVE_OPTIONS}

#: Every broker call is bounded: a frozen or unreachable Redis fails a publish in seconds (the
#: outbox retries it, engine.master.commands), never hangs a thread.
BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 300,
    "socket_timeout": 5,
    "socket_connect_timeout": 2,
    **REDIS_LINK_CHECKS,
}
