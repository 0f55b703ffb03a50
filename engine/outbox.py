"""A process's outbox of Celery commands, published by a thread of its own, so that the loop
that sends them (the master's, a coordinator event loop) never waits on the broker.

Every command re-states an intent kept elsewhere (a database row, a tracked assignment), so the
outbox needs no durability of its own: it is bounded, drops its oldest when full, and whatever is
lost is sent again by whoever sent it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from celery import current_app

log = logging.getLogger("keel.outbox")
OUTBOX_LIMIT = 10_000
RETRY_MAX = 1.0


class Outbox:
    """Commands waiting to be published, oldest first, and the thread that publishes them.

    While the broker is away the head is retried with a capped backoff (each publish bounded by
    the broker's socket timeouts); commands keep their order, and once the broker is back they
    go out at once.
    """

    def __init__(self, limit: int = OUTBOX_LIMIT) -> None:
        self._pending: deque[tuple[str, list, str]] = deque(maxlen=limit)
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def put(self, task: str, args: list, queue: str) -> None:
        with self._changed:
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1
            self._pending.append((task, args, queue))
            self._changed.notify_all()
            self._start()

    def warm(self) -> None:
        """Start the publishing thread now and have it connect to the broker before any
        command is put: a standby master that takes over publishes its first commands at once
        (a cold producer took a second under load, on the recovery path). Never waits."""
        with self._changed:
            self._start()

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="outbox", daemon=True)
            self._thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait until every command put so far has been published (False on timeout)."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending, timeout)

    def _run(self) -> None:
        _connect()
        backoff = 0.0
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending)
                head = self._pending[0]
            if _publish(*head, quiet=backoff > 0):
                backoff = 0.0
                with self._changed:
                    if self._pending and self._pending[0] is head:
                        self._pending.popleft()
                    self._changed.notify_all()
                continue
            backoff = min(max(backoff * 2, 0.05), RETRY_MAX)
            with self._changed:  # a wait, not a sleep: flush() and put() still get the lock
                self._changed.wait(backoff)


def _connect() -> None:
    """Open the producer's broker connection (and load what publishing needs), bounded by the
    broker's socket timeouts; a broker that is down is met again by the first publish."""
    try:
        current_app.amqp.router  # noqa: B018 (built on first use)
        with current_app.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=1)
    except Exception as exc:
        log.info("outbox: broker not reached yet (%s); publishing will retry", exc)


def _publish(task: str, args: list, queue: str, quiet: bool = False) -> bool:
    try:
        current_app.send_task(task, args=args, queue=queue, retry=False)
        return True
    except Exception as exc:
        if not quiet:
            log.warning("could not send %s to %s (retrying): %s", task, queue, exc)
        return False
