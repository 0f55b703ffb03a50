"""A process's outbox of Celery commands, published by a thread of its own, so that the loop
that sends them (the master's, a coordinator event loop) never waits on the broker.

Every command re-states an intent kept elsewhere (a database row, a tracked assignment), so the
outbox needs no durability of its own: it is bounded, drops its oldest when full, and whatever is
lost is sent again by whoever sent it.

What is waiting for one member's queue goes out as one message (``TASK_MEMBER_COMMANDS``): under
a hundred streaming jobs the master sends hundreds of barriers and commits a second, and a
Celery message each was most of the master's CPU and much of every worker's.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from celery import current_app

from engine.protocol import TASK_MEMBER_COMMANDS

log = logging.getLogger("keel.outbox")
OUTBOX_LIMIT = 10_000
RETRY_MAX = 1.0
#: At most this many commands are taken from the outbox for one round of messages.
TAKE_LIMIT = 500

#: A command: (task name, args, queue, may it share a message with others for its queue).
Command = tuple[str, list, str, bool]
#: A message: (task name, args, queue).
Message = tuple[str, list, str]


def messages_of(commands: list[Command]) -> list[Message]:
    """The messages that carry ``commands``: the batchable ones for a queue share one message
    (in their order), the others go alone. Each queue's commands keep their order: a command
    that may not be batched ends the batch open for its queue."""
    messages: list[Message] = []
    open_batches: dict[str, list] = {}
    for task, args, queue, batchable in commands:
        if not batchable:
            open_batches.pop(queue, None)
            messages.append((task, args, queue))
            continue
        batch = open_batches.get(queue)
        if batch is None:
            batch = open_batches[queue] = []
            messages.append((TASK_MEMBER_COMMANDS, [batch], queue))
        batch.append([task, args])
    return [_alone_if_single(message) for message in messages]


def _alone_if_single(message: Message) -> Message:
    """A batch of one command is sent as the command itself."""
    task, args, queue = message
    if task == TASK_MEMBER_COMMANDS and len(args[0]) == 1:
        ((inner_task, inner_args),) = args[0]
        return inner_task, inner_args, queue
    return message


class Outbox:
    """Commands waiting to be published, oldest first, and the thread that publishes them.

    While the broker is away the head is retried with a capped backoff (each publish bounded by
    the broker's socket timeouts); commands keep their order, and once the broker is back they
    go out at once.
    """

    def __init__(self, limit: int = OUTBOX_LIMIT) -> None:
        self._pending: deque[Command] = deque(maxlen=limit)
        #: Messages taken from the outbox and not all published yet.
        self._publishing = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def put(self, task: str, args: list, queue: str, batch: bool = False) -> None:
        """Publish ``task(*args)`` on ``queue`` soon. ``batch``: the consumer takes commands
        batched (a member of ``COMMAND_BATCHES_SINCE``), so it may share a message with the
        others waiting for that queue."""
        with self._changed:
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1
            self._pending.append((task, args, queue, batch))
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
            return self._changed.wait_for(
                lambda: not self._pending and not self._publishing, timeout
            )

    def _take(self) -> deque[Message]:
        """Wait for commands, then take what is waiting (up to TAKE_LIMIT) as messages."""
        with self._changed:
            self._changed.wait_for(lambda: self._pending)
            taken = [self._pending.popleft() for _ in range(min(len(self._pending), TAKE_LIMIT))]
            self._publishing = True
        return deque(messages_of(taken))

    def _run(self) -> None:
        _connect()
        backoff = 0.0
        messages: deque[Message] = deque()
        while True:
            if not messages:
                messages = self._take()
            if _publish(*messages[0], quiet=backoff > 0):
                backoff = 0.0
                messages.popleft()
                if not messages:
                    with self._changed:
                        self._publishing = False
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
