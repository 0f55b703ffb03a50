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
"""

from __future__ import annotations

import time

from engine.models import TaskGroup
from engine.outbox import Outbox
from engine.protocol import TASK_SOURCE_ACK, member_queue
from engine.sourceruntime.choices import CommandKind
from engine.states import TaskGroupKind

REGISTER = CommandKind.REGISTER.value
ASSIGNMENT_ACK = CommandKind.ASSIGNMENT_ACK.value
SNAPSHOT = "SNAPSHOT"
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
        if self.confirmed or self.registration is None:
            return
        now = time.monotonic() if now is None else now
        if now >= self.next_register:
            self.next_register = now + REGISTER_EVERY
            self._send(self.registration)

    def _send(self, message: dict) -> None:
        address = self.address
        if address is None:
            return  # no enumerator to tell (a registration is sent again)
        group, attempt, uuid, name = address
        self.outbox.put(TASK_SOURCE_ACK, [group, attempt, uuid, message], member_queue(name))
