"""The managed reader's lifecycle and its schema-change sub-state, as executable machines.

Main lifecycle: CREATED -> RESTORING -> RUNNING -> DRAINING -> CLOSED, with CANCELLING and
FAILED reachable from any live state, both ending CLOSED. Schema change is orthogonal:
IDLE -> QUIESCING -> TRIGGER_REQUESTED -> WAITING_END -> IDLE; only the bound checkpoint id and
request epoch advance it, stale and duplicate callbacks are ignored and counted, and abort,
timeout, an overlapping request or a failed trigger fail the reader. While a schema change is
under way no poll turn runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Life(StrEnum):
    CREATED = "CREATED"
    RESTORING = "RESTORING"
    RUNNING = "RUNNING"
    DRAINING = "DRAINING"
    CANCELLING = "CANCELLING"
    FAILED = "FAILED"
    CLOSED = "CLOSED"


LIVE = frozenset({Life.CREATED, Life.RESTORING, Life.RUNNING, Life.DRAINING})
MOVES: dict[Life, frozenset[Life]] = {
    Life.CREATED: frozenset({Life.RESTORING, Life.RUNNING}),
    Life.RESTORING: frozenset({Life.RUNNING}),
    Life.RUNNING: frozenset({Life.DRAINING}),
    Life.DRAINING: frozenset({Life.CLOSED}),
    Life.CANCELLING: frozenset({Life.CLOSED}),
    Life.FAILED: frozenset({Life.CLOSED}),
    Life.CLOSED: frozenset(),
}


class IllegalTransition(Exception):
    pass


class Lifecycle:
    def __init__(self) -> None:
        self.state = Life.CREATED

    def move(self, target: Life) -> None:
        allowed = MOVES[self.state] | (
            {Life.CANCELLING, Life.FAILED} if self.state in LIVE else set()
        )
        if target not in allowed:
            raise IllegalTransition(f"{self.state} -> {target}")
        self.state = target

    @property
    def live(self) -> bool:
        return self.state in LIVE


class Schema(StrEnum):
    IDLE = "IDLE"
    QUIESCING = "QUIESCING"
    TRIGGER_REQUESTED = "TRIGGER_REQUESTED"
    WAITING_END = "WAITING_END"


class SchemaChangeFailed(Exception):
    """Abort, timeout, an overlapping request or a failed trigger: the reader fails."""


@dataclass
class SchemaChange:
    state: Schema = Schema.IDLE
    checkpoint: int | None = None  # the schema checkpoint this change is bound to
    epoch: int | None = None  # the request's epoch
    ignored: int = 0  # stale or duplicate callbacks

    def request(self, epoch: int) -> None:
        if self.state != Schema.IDLE:
            raise SchemaChangeFailed("a schema change is already under way")
        self.state, self.epoch, self.checkpoint = Schema.QUIESCING, epoch, None

    def quiesced(self, epoch: int) -> bool:
        """The reader stopped polling: ask for the schema checkpoint."""
        return self._advance(epoch, None, Schema.QUIESCING, Schema.TRIGGER_REQUESTED)

    def triggered(self, epoch: int, checkpoint: int) -> bool:
        if self._stale(epoch, None, Schema.TRIGGER_REQUESTED):
            return False
        self.state, self.checkpoint = Schema.WAITING_END, checkpoint
        return True

    def completed(self, epoch: int, checkpoint: int) -> bool:
        """The bound checkpoint completed: back to IDLE (the reader resumes)."""
        if self._stale(epoch, checkpoint, Schema.WAITING_END):
            return False
        self.state, self.checkpoint, self.epoch = Schema.IDLE, None, None
        return True

    def failed(self, epoch: int, why: str) -> None:
        """Abort, timeout or trigger failure of the current request fails the reader; one of
        an older request is ignored."""
        if self.epoch is None or epoch != self.epoch:
            self.ignored += 1
            return
        raise SchemaChangeFailed(why)

    def fence(self) -> None:
        """Cancel or fatal failure: the request is dropped; its later callbacks are stale."""
        self.state, self.checkpoint, self.epoch = Schema.IDLE, None, None

    def _advance(self, epoch, checkpoint, source: Schema, target: Schema) -> bool:
        if self._stale(epoch, checkpoint, source):
            return False
        self.state = target
        return True

    def _stale(self, epoch: int, checkpoint: int | None, source: Schema) -> bool:
        if (
            self.state != source
            or epoch != self.epoch
            or (checkpoint is not None and checkpoint != self.checkpoint)
        ):
            self.ignored += 1
            return True
        return False

    @property
    def blocks_polling(self) -> bool:
        return self.state != Schema.IDLE
