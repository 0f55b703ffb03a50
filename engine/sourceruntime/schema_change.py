"""A reader's schema change, driven through its sub-state by the reader event loop.

A connector that finds its input's columns changed (a LocalFile file with new columns) sets
``schema_request`` (the new schema) and ends its poll call before emitting any record of it.
The loop then stops polling (QUIESCING, at once: the turn has ended), asks for a checkpoint now
(TRIGGER_REQUESTED; the task group records the request where the master reads it) and binds
the next barrier it applies (WAITING_END): that checkpoint's snapshot holds the new schema, so a
restore from it runs the new schema, and the rows before the change are committed by it. Once
it completed, the task group makes its sinks follow (a Jdbc sink adds the column) and compiles
its chain again; only then does the connector take the new schema and polling resume (IDLE).

The bound checkpoint's abort, the timeout (``schema-change.timeout``), an overlapping request
and a sink that cannot follow fail the reader (``SchemaChangeFailed``); a sink that is not ready
yet (``SchemaChangePending``: a lock held by another writer) is tried again at the next step,
within the timeout. Without checkpoints the change applies at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.sourceruntime.lifecycle import Schema, SchemaChange, SchemaChangeFailed

#: The option a timeout names.
TIMEOUT_OPTION = "engine.source-runtime.schema-change.timeout"


class SchemaChangePending(Exception):
    """The sinks cannot follow yet: try again at a later step. ``backoff``: a lock another
    writer holds (tried again after a growing delay); else a short wait of the reader's own
    (a checkpoint not committed yet), tried again at its next step."""

    def __init__(self, why: str, backoff: bool = True) -> None:
        super().__init__(why)
        self.backoff = backoff


class SchemaDriver:
    """The loop's side of a schema change: the machine, the pending schema and the schema in
    effect (None: the plan's), the request's start, and the task group's two callbacks."""

    def __init__(
        self,
        reader: Any,
        clock: Callable[[], float],
        timeout: float,
        checkpointing: bool,
        request_checkpoint: Callable[[], None] = lambda: None,
        apply: Callable[[list], None] = lambda schema: None,
    ) -> None:
        self.reader, self.clock, self.timeout = reader, clock, timeout
        self.checkpointing = checkpointing
        self.request_checkpoint, self.apply = request_checkpoint, apply
        self.machine = SchemaChange()
        self.epoch = 0
        self.pending: list | None = None
        self.current: list | None = None
        self.started: float | None = None
        self.ready = False  # the bound checkpoint completed: the sinks may follow
        self.changes = self.retries = 0
        #: When a sink that was not ready is tried again (backing off 0.2 s to 5 s, so other
        #: writers of its table are not queued behind its lock request again and again).
        self.next_try = 0.0

    @property
    def blocks_polling(self) -> bool:
        return self.machine.blocks_polling

    def schema_now(self) -> list | None:
        """What a snapshot taken now records: the pending schema once a change is under way
        (the rows after the snapshot are of it), else the one in effect."""
        return self.pending if self.machine.state != Schema.IDLE else self.current

    def after_poll(self) -> None:
        """The poll call just ended: a request it made starts a change."""
        request = getattr(self.reader, "schema_request", None)
        if request is None:
            return
        self.reader.schema_request = None
        self.epoch += 1
        self.machine.request(self.epoch)  # an overlapping request fails the reader here
        self.pending, self.started, self.ready = request, self.clock(), False
        self.retries, self.next_try = 0, 0.0
        self.machine.quiesced(self.epoch)  # the turn ended: no poll runs until it is done
        if not self.checkpointing:  # nothing to bind: the sinks follow at once
            self.machine.triggered(self.epoch, 0)
            self.ready = True
            return
        self.request_checkpoint()

    def on_barrier(self, checkpoint: int) -> None:
        """A barrier applied while the change waits for one: it is the schema checkpoint."""
        if self.machine.state == Schema.TRIGGER_REQUESTED:
            self.machine.triggered(self.epoch, checkpoint)

    def completed(self, checkpoint: int) -> None:
        bound = self.machine.checkpoint
        if self.machine.state == Schema.WAITING_END and bound is not None and bound <= checkpoint:
            self.ready = True

    def aborted(self, checkpoint: int) -> None:
        if self.machine.state == Schema.WAITING_END and self.machine.checkpoint == checkpoint:
            self.machine.failed(
                self.epoch, f"schema change failed: its schema checkpoint {checkpoint} was aborted"
            )

    def fence(self) -> None:
        """Cancel or fatal failure: the request ends; nothing of it applies."""
        self.machine.fence()
        self.pending, self.started, self.ready = None, None, False

    def step(self) -> bool:
        """Past the timeout the reader fails; once the bound checkpoint completed the sinks
        follow and the connector takes the schema. True when it did work."""
        if self.machine.state == Schema.IDLE:
            return False
        if self.started is None:  # the machine was moved without a request through here
            self.started = self.clock()
        if self.clock() - self.started > self.timeout:
            self.machine.failed(
                self.epoch,
                f"schema change failed: not applied within {TIMEOUT_OPTION} "
                f"({self.timeout:g} s; state {self.machine.state.value})",
            )
        if not self.ready or self.clock() < self.next_try:
            return False
        try:
            self.apply(self.pending)
        except SchemaChangePending as pending:
            if pending.backoff:
                self.retries += 1
                self.next_try = self.clock() + min(0.2 * 2 ** (self.retries - 1), 5.0)
            return False
        except SchemaChangeFailed:
            raise
        except Exception as exc:  # a sink that cannot follow: the seed's trigger failure
            raise SchemaChangeFailed(f"schema change failed: {exc}") from exc
        self.reader.schema_changed(self.pending)
        self.current, self.pending, self.ready = self.pending, None, False
        self.machine.completed(self.epoch, self.machine.checkpoint)
        self.changes += 1
        return True
