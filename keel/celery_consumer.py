"""The Celery consumer of every engine process: back on the broker within a second of it
answering again.

Celery's consumer reconnects through kombu's ``ensure_connection`` with kombu's default
backoff (2 s, then 4, 6, ... up to 30 s between attempts), and no setting changes it. After a
partition from Redis of a quarter of a minute, a member then heard no command for up to 10 s
more: no checkpoint barrier, no deployment. This consumer tries every second at most; a try
costs one connect (``broker_connection_timeout``, 2 s) against a broker that is down.
"""

from __future__ import annotations

import functools

from celery.worker.consumer import Consumer

#: Seconds between reconnection attempts: the first, the step added each time, the most.
RETRY_START, RETRY_STEP, RETRY_MAX = 0.2, 0.4, 1.0


class PromptConsumer(Consumer):
    def ensure_connected(self, conn):
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=RETRY_START,
            interval_step=RETRY_STEP,
            interval_max=RETRY_MAX,
        )
        return super().ensure_connected(conn)
