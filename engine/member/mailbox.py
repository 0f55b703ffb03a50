"""A task group's bounded mailbox: ordered commands drained by its own thread between batches.

Celery pool threads only offer messages here; the task group handles them at a batch boundary,
so a checkpoint barrier cuts the data in order and a commit (or an abort) follows its
checkpoint.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass

MAILBOX_SIZE = 64


@dataclass(frozen=True)
class Barrier:
    """Snapshot for checkpoint ``checkpoint_id`` and acknowledge it."""

    checkpoint_id: int


@dataclass(frozen=True)
class Commit:
    """Checkpoint ``checkpoint_id`` completed: commit what the sinks prepared for it."""

    checkpoint_id: int


@dataclass(frozen=True)
class Abort:
    """Checkpoint ``checkpoint_id`` ended without completing (expired, failed, redeployed): a
    Lane A task group forgets what it proved (Lane B ones ignore it)."""

    checkpoint_id: int


Message = Barrier | Commit | Abort


class Mailbox:
    def __init__(self, size: int = MAILBOX_SIZE) -> None:
        self._queue: queue.Queue[Message] = queue.Queue(maxsize=size)

    def offer(self, message: Message) -> bool:
        """False when full: the sender's command is dropped and re-sent by its protocol (a
        barrier times out, a commit is completed by the next attempt's restore)."""
        try:
            self._queue.put_nowait(message)
            return True
        except queue.Full:
            return False

    def drain(self, handle: Callable[[Message], None]) -> None:
        while True:
            try:
                message = self._queue.get_nowait()
            except queue.Empty:
                return
            handle(message)
