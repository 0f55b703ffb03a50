"""Capturing the log lines a task group's code writes on this worker, for its job page.

A task group's thread (engine.member.runtime) binds its (task group, attempt) in a context
variable; work it hands to the shared coordinator pool runs in a copy of that context
(engine.sourceruntime.coordinator), so a plugin's lines are attributed wherever they run. A
``logging.Handler`` on the root logger keeps the records written under such a binding in a
bounded buffer, and engine.member.tasklog_shipping ships them. Records without one (the
worker's own) are left to the worker's log, where every record still goes.

The handler never blocks the data plane: an append under a short lock, no I/O. A full buffer
drops its oldest line and counts it; the count is shipped later as one WARNING line per task
group.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass

#: The (task group id, attempt) whose code this thread (or pool work item) runs.
TASK_GROUP: ContextVar[tuple[int, int] | None] = ContextVar("keel_task_group", default=None)

#: Lines kept in memory while the database cannot take them (or between flushes).
BUFFER_LINES = 10_000
#: A line's message (with its traceback) is cut to this many characters.
MAX_MESSAGE = 4096
#: The logger name of the line saying how many lines a task group lost to a full buffer.
DROPPED_LOGGER = "keel.tasklogs"


@dataclass(slots=True, frozen=True)
class Line:
    task_group_id: int
    attempt: int
    created: float  # seconds since the epoch, as ``LogRecord.created``
    level: int
    logger: str
    message: str


def bind(task_group_id: int, attempt: int) -> Token:
    """From now on, in this context, log records are this task group attempt's."""
    return TASK_GROUP.set((task_group_id, attempt))


@contextmanager
def attributed(task_group_id: int, attempt: int) -> Iterator[None]:
    """Records written inside the block are this task group attempt's."""
    token = bind(task_group_id, attempt)
    try:
        yield
    finally:
        TASK_GROUP.reset(token)


class LineBuffer:
    """Lines waiting to be shipped, at most ``capacity``; the shipper reads from the front and
    removes what it wrote, so lines a failed flush could not write stay, in order."""

    def __init__(self, capacity: int = BUFFER_LINES) -> None:
        self.capacity = capacity
        self._lines: deque[Line] = deque()
        self._lock = threading.Lock()
        #: Lines dropped because the buffer was full, by (task group, attempt).
        self._dropped: dict[tuple[int, int], int] = {}
        #: Lines evicted from the front so far: a flush that peeked before knows how many of
        #: the lines it wrote are no longer there to remove.
        self._evicted = 0

    def append(self, line: Line) -> None:
        """Keep ``line``; a full buffer gives up its oldest line (counted as dropped), since
        the newest say most about what goes wrong, an outage's failure above all."""
        with self._lock:
            if len(self._lines) >= self.capacity:
                old = self._lines.popleft()
                key = (old.task_group_id, old.attempt)
                self._dropped[key] = self._dropped.get(key, 0) + 1
                self._evicted += 1
            self._lines.append(line)

    def peek(self, limit: int) -> tuple[list[Line], dict[tuple[int, int], int], int]:
        """The oldest ``limit`` lines, the drop counts so far and a mark to hand back to
        ``consume`` (nothing is removed)."""
        with self._lock:
            count = min(limit, len(self._lines))
            lines = [self._lines[i] for i in range(count)]
            return lines, dict(self._dropped), self._evicted

    def consume(
        self, written: list[Line], dropped: dict[tuple[int, int], int], mark: int = 0
    ) -> None:
        """The ``written`` lines, peeked from the front at ``mark``, and the ``dropped`` counts
        landed. Lines evicted since the peek were the batch's first: they are gone already, and
        were not lost after all."""
        with self._lock:
            evicted = min(len(written), self._evicted - mark)
            for line in written[:evicted]:
                key = (line.task_group_id, line.attempt)
                if self._dropped.get(key, 0) > 1:
                    self._dropped[key] -= 1
                else:
                    self._dropped.pop(key, None)
            for _ in range(min(len(written) - evicted, len(self._lines))):
                self._lines.popleft()
            for key, number in dropped.items():
                left = self._dropped.get(key, 0) - number
                if left > 0:
                    self._dropped[key] = left
                else:
                    self._dropped.pop(key, None)

    def discard(self, count: int, mark: int = 0) -> None:
        """Give up on the ``count`` oldest lines, as peeked at ``mark`` (a batch the database
        keeps refusing): they are counted as dropped, so their task groups' pages say so."""
        with self._lock:
            count -= min(count, self._evicted - mark)
            for _ in range(min(count, len(self._lines))):
                line = self._lines.popleft()
                key = (line.task_group_id, line.attempt)
                self._dropped[key] = self._dropped.get(key, 0) + 1

    def __len__(self) -> int:
        with self._lock:
            return len(self._lines)


def dropped_lines(dropped: dict[tuple[int, int], int], now: float | None = None) -> list[Line]:
    """One WARNING line per task group attempt that lost lines."""
    at = time.time() if now is None else now
    return [
        Line(group, attempt, at, logging.WARNING, DROPPED_LOGGER, f"{count} log lines dropped")
        for (group, attempt), count in sorted(dropped.items())
    ]


class TaskLogHandler(logging.Handler):
    """Keeps the records of task-group code in ``buffer``; ignores every other record."""

    def __init__(self, buffer: LineBuffer) -> None:
        super().__init__()
        self.buffer = buffer
        self._format = logging.Formatter()

    def handle(self, record: logging.LogRecord) -> bool:
        # No handler lock: every task group thread logs through here, and the buffer has a
        # lock of its own (held only to append).
        if TASK_GROUP.get() is None or not self.filter(record):
            return False
        return self._emit(record)

    def emit(self, record: logging.LogRecord) -> None:
        self._emit(record)

    def _emit(self, record: logging.LogRecord) -> bool:
        where = TASK_GROUP.get()
        if where is None:
            return False
        try:
            message = self.message_of(record)
        except Exception:
            self.handleError(record)
            return False
        name = record.name[:200]
        self.buffer.append(Line(where[0], where[1], record.created, record.levelno, name, message))
        return True

    def message_of(self, record: logging.LogRecord) -> str:
        """The message with its exception and stack, if any, cut to MAX_MESSAGE characters."""
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self._format.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        if record.stack_info:
            message = f"{message}\n{self._format.formatStack(record.stack_info)}"
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        return message
