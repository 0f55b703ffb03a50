"""The versioned command envelope and its admission acknowledgement.

Every ordered command to a managed reader travels in an immutable envelope whose header names
its target (job, source runtime, attempt), its sender (coordinator epoch, sender attempt and
sequence), its identity (command id and kind, durability) and its payload (version, checksum,
bytes). The wire form is versioned JSON; the payload is opaque bytes to everything but the event
loop that applies it, so an operation thread never deserializes connector state.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass, field

from engine.sourceruntime.choices import COMMANDS, AdmissionStatus, CommandKind, Durability

#: The command protocol's major version (an unknown major fails fast) and minor version.
PROTOCOL_VERSION = 1
PROTOCOL_MINOR = 0
#: The payload versions each command kind's applier reads.
PAYLOAD_VERSIONS: dict[CommandKind, frozenset[int]] = {kind: frozenset({1}) for kind in COMMANDS}
#: The wire form's own version (what ``to_wire``/``from_wire`` read and write).
WIRE_VERSION = 1


def checksum(payload: bytes) -> str:
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


@dataclass(frozen=True)
class SourceCommandEnvelope:
    protocolVersion: int
    jobId: int
    sourceRuntimeId: str  # the pipeline's source: "<job>/<pipeline>"
    coordinatorEpoch: int
    senderAttemptId: int
    targetAttemptId: int
    senderSequence: int
    commandId: str
    commandKind: str
    durability: str
    payloadVersion: int
    payloadChecksum: str
    payloadBytes: int
    payload: bytes = field(repr=False, default=b"")

    @classmethod
    def build(
        cls,
        *,
        job_id: int,
        source_runtime_id: str,
        epoch: int,
        sender_attempt: int,
        target_attempt: int,
        sequence: int,
        command_id: str,
        kind: CommandKind,
        payload: bytes = b"",
        payload_version: int = 1,
    ) -> SourceCommandEnvelope:
        """An envelope whose header agrees with its payload (durability from the kind)."""
        return cls(
            protocolVersion=PROTOCOL_VERSION,
            jobId=job_id,
            sourceRuntimeId=source_runtime_id,
            coordinatorEpoch=epoch,
            senderAttemptId=sender_attempt,
            targetAttemptId=target_attempt,
            senderSequence=sequence,
            commandId=command_id,
            commandKind=kind.value,
            durability=COMMANDS[kind][0].value,
            payloadVersion=payload_version,
            payloadChecksum=checksum(payload),
            payloadBytes=len(payload),
            payload=payload,
        )

    @property
    def kind(self) -> CommandKind:
        return CommandKind(self.commandKind)

    def header_problem(self, max_payload: int) -> str | None:
        """Why the header or payload is unacceptable (a reason code), or None."""
        try:
            kind = CommandKind(self.commandKind)
        except ValueError:
            return "UNKNOWN_KIND"
        if self.durability != COMMANDS[kind][0].value:
            return "DURABILITY_MISMATCH"
        if self.payloadVersion not in PAYLOAD_VERSIONS[kind]:
            return "UNSUPPORTED_PAYLOAD_VERSION"
        if self.payloadBytes != len(self.payload):
            return "SIZE_MISMATCH"
        if self.payloadBytes > max_payload:
            return "PAYLOAD_TOO_LARGE"
        if self.payloadChecksum != checksum(self.payload):
            return "CHECKSUM_MISMATCH"
        if not self.commandId or self.senderSequence < 0:
            return "BAD_HEADER"
        return None

    def to_wire(self) -> str:
        data = asdict(self)
        data["payload"] = base64.b64encode(self.payload).decode()
        return json.dumps({"wire": WIRE_VERSION, **data}, separators=(",", ":"))

    @classmethod
    def from_wire(cls, text: str) -> SourceCommandEnvelope:
        """ValueError for anything but a well-formed envelope of a known wire version."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.pop("wire", None) != WIRE_VERSION:
            raise ValueError("unknown wire version")
        data["payload"] = base64.b64decode(data.get("payload", ""), validate=True)
        return cls(**data)


@dataclass(frozen=True)
class AdmissionAck:
    status: AdmissionStatus
    targetAttemptId: int
    mailboxSequence: int | None = None
    retryAfterMillis: int | None = None
    reasonCode: str | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "status": self.status.value}


def durable(kind: CommandKind) -> bool:
    return COMMANDS[kind][0] in (Durability.CHECKPOINT_COUPLED, Durability.RECONSTRUCTABLE)
