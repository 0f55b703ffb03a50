"""A Lane A reader's messages to its enumerator, and their wire form: registration, assignment
acknowledgements and snapshot reports. They travel as ``engine.source.ack`` on the enumerator's
member queue, through the worker's outbox (the reader's thread never waits on the broker), and
the enumerator's handler posts them to its coordinator loop, as it does admission answers.

- ``REGISTER``: each reader attempt, as it starts, names itself (index, task group, attempt,
  member) and what its restored runtime metadata proves (attempt lineage, applied sender
  watermarks, recent assignments). It is sent again every ``REGISTER_EVERY`` seconds until the
  enumerator's ``REGISTER`` command (the confirmation, carrying where to send the rest) is
  applied: the enumerator reconciles the attempt, then assigns to it, and only to it.
- ``ASSIGNMENT_ACK``: the splits of assignments the reader applied (APPLIED in the tracker),
  batched per step of the task group's thread. Flow control, not durability: one lost changes
  nothing but a count.
- ``SNAPSHOT``: a checkpoint's snapshot was acknowledged, with the metadata that proves what it
  includes (CHECKPOINT_INCLUDED until the checkpoint completes or aborts). Lost, the
  enumerator's completion look-up proves the same from the stored snapshot.
- ``SOURCE_EVENT``: what a reader that has ``source_event()`` tells its enumerator (LocalFile's
  backlog), EPHEMERAL: asked for at most every ``source-runtime.source-events.interval`` (1 s)
  once the registration is confirmed, sent when it changed (the reader says what a change is:
  LocalFile's report holds until its files change or its bytes move by more than a tenth) or,
  unchanged, every ``EVENT_REFRESH``, so events coalesce to the newest and one lost is replaced
  by the next. Put batched (``TASK_MEMBER_COMMANDS``): a hundred readers' events for one
  enumerator share messages, not one each (an enumerator that knows SOURCE_EVENT takes batches).
  It names the reader's attempt and the enumerator's epoch it was confirmed by: the enumerator
  ignores (and counts) one of another. Never part of a checkpoint; no event goes from an
  enumerator to its readers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings

from engine.models import TaskGroup
from engine.outbox import Outbox
from engine.protocol import TASK_SOURCE_ACK, member_queue
from engine.sourceruntime.choices import CommandKind
from engine.states import TaskGroupKind

REGISTER = CommandKind.REGISTER.value
ASSIGNMENT_ACK = CommandKind.ASSIGNMENT_ACK.value
SNAPSHOT = "SNAPSHOT"
SOURCE_EVENT = CommandKind.SOURCE_EVENT.value
#: An unchanged source event is sent again this often (seconds): one lost is replaced.
EVENT_REFRESH = 5.0
#: A reader not confirmed yet registers again this often (the enumerator may be starting).
REGISTER_EVERY = 0.25
#: The runtime metadata a registration and a snapshot report carry (what proves ownership).
PROOF_KEYS = ("readerAttemptLineage", "appliedSenderWatermarks")


def enumerator_of(pipeline_id: int) -> list | None:
    """Where the pipeline's enumerator takes messages: [task group, attempt, member uuid,
    member name] (None while it has no member)."""
    group = (
        TaskGroup.objects.filter(pipeline_id=pipeline_id, kind=TaskGroupKind.ENUMERATOR)
        .select_related("member")
        .first()
    )
    if group is None or group.member is None:
        return None
    return [group.id, group.attempt, str(group.member.uuid), group.member.name]


class EnumeratorLink:
    """One reader attempt's side of the link, used on the task group's thread only."""

    def __init__(self, outbox: Outbox, reader: int, attempt: int, address: list | None) -> None:
        self.outbox, self.reader, self.attempt = outbox, reader, attempt
        #: Where messages go: the enumerator found when the attempt started, then the one whose
        #: confirmation was applied.
        self.address = address
        self.registration: dict | None = None
        self.confirmed = False
        self.next_register = 0.0
        self._applied: list[str] = []
        #: The reader's ``source_event`` (None: it has none), how often it is asked, when next,
        #: the newest event sent and when, and how many were sent.
        self.event_source: Callable[[], dict | None] | None = None
        self.event_every = 1.0
        self.next_event = self.event_sent = 0.0
        self.last_event: dict | None = None
        self.events_sent = 0

    def events_from(self, source: Callable[[], dict | None] | None) -> None:
        """The reader's events, asked for at most every ``source-events.interval``."""
        self.event_source = source
        self.event_every = settings.ENGINE.get("source-runtime.source-events.interval", 1.0)

    def register(self, task_group_id: int, member_uuid: str, member_name: str, metadata: dict):
        """Registers now, and again until confirmed; ``metadata``: the restored snapshot's (or
        a fresh attempt's) runtime metadata."""
        self.registration = {
            "kind": REGISTER,
            "reader": self.reader,
            "taskGroupId": task_group_id,
            "attempt": self.attempt,
            "memberUuid": member_uuid,
            "memberName": member_name,
            "metadata": {
                **{key: metadata.get(key) for key in PROOF_KEYS},
                "recentAssignments": metadata.get("recentAssignments") or [],
            },
        }
        self.tick()

    def confirm(self, payload: dict) -> None:
        """The enumerator's REGISTER command was applied: registered, and where it listens."""
        self.confirmed = True
        self.address = payload.get("enumerator") or self.address

    def applied(self, payload: dict) -> None:
        self._applied += [split["splitId"] for split in payload.get("splits", ())]

    def snapshot(self, checkpoint: int, metadata: dict) -> None:
        self._send(
            {
                "kind": SNAPSHOT,
                "reader": self.reader,
                "attempt": self.attempt,
                "checkpoint": checkpoint,
                "metadata": {key: metadata.get(key) for key in PROOF_KEYS},
            }
        )

    def tick(self, now: float | None = None) -> None:
        """After each step: the acknowledgements gathered, and the registration when due."""
        if self._applied:
            ids, self._applied = self._applied, []
            message = {"kind": ASSIGNMENT_ACK, "reader": self.reader, "attempt": self.attempt}
            self._send({**message, "splits": ids})
        now = time.monotonic() if now is None else now
        if self.confirmed:
            self._event(now)
        if self.confirmed or self.registration is None:
            return
        if now >= self.next_register:
            self.next_register = now + REGISTER_EVERY
            self._send(self.registration)

    def _event(self, now: float) -> None:
        """The reader's source event, when due and changed (or due for a refresh)."""
        if self.event_source is None or now < self.next_event or self.address is None:
            return
        self.next_event = now + self.event_every
        event = self.event_source()
        if event is None or (event == self.last_event and now < self.event_sent + EVENT_REFRESH):
            return
        self.last_event, self.event_sent = event, now
        self.events_sent += 1
        message = {"kind": SOURCE_EVENT, "reader": self.reader, "attempt": self.attempt}
        self._send({**message, "epoch": self.address[1], "event": event})

    def _send(self, message: dict) -> None:
        """Batched: it may share a message with the others waiting for the enumerator's queue
        (every Lane A member takes batches: the lane needs a cluster of one version)."""
        address = self.address
        if address is None:
            return  # no enumerator to tell (a registration is sent again)
        group, attempt, uuid, name = address
        args = [group, attempt, uuid, message]
        self.outbox.put(TASK_SOURCE_ACK, args, member_queue(name), batch=True)
