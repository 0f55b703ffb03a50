"""Lanes and capabilities: which runtime a pipeline's source gets, recorded once.

A connector declares a versioned capability descriptor (not a boolean); its digest is recorded
with the lane in the job plan, the deployment and the checkpoint's runtime metadata. Lane A is
chosen only for a connector on the allow-list (``engine.source-runtime.managed-connectors``)
that declares a capability, while the kill switch is on; a restore takes the recorded lane and
fails before execution if the installed connector's digest differs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from engine.sourceruntime.choices import Lane

#: The managed lane's own version, recorded in the runtime metadata.
MANAGED_LANE_VERSION = 1
#: 2: the metadata records the connector state's version (``connectorStateVersion``) and the
#: reader's recent assignments (``recentAssignments``).
RUNTIME_METADATA_VERSION = 2
#: The enumerator's checkpointed state (its tracker, pending splits, discovery), recorded as
#: ``enumeratorStateVersion`` in it.
ENUMERATOR_STATE_VERSION = 1


@dataclass(frozen=True)
class ManagedSourceCapability:
    runtime_protocol_version: int = 1
    bounded_poll: bool = True
    wakeup: bool = True
    attempt_fencing: bool = True
    source_events: bool = False
    async_enumerator: bool = False

    @property
    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class LaneMismatch(Exception):
    """A restore whose recorded lane or capability no longer matches the installed connector."""


@dataclass(frozen=True)
class SourceRuntime:
    """What the plan, the deployment and the checkpoint record for a pipeline's source."""

    lane: Lane
    capability_digest: str | None

    def to_json(self) -> dict:
        return {"lane": self.lane.value, "capabilityDigest": self.capability_digest}

    @classmethod
    def from_json(cls, data: dict | None) -> SourceRuntime:
        """A plan made before lanes existed ran in Lane B."""
        if not data:
            return LEGACY
        return cls(Lane(data["lane"]), data.get("capabilityDigest"))


LEGACY = SourceRuntime(Lane.LEGACY, None)


def capability_of(plugin: type) -> ManagedSourceCapability | None:
    return getattr(plugin, "managed_capability", None)


def choose(plugin: type, engine: dict) -> SourceRuntime:
    """The lane of a new deployment of ``plugin``'s source."""
    capability = capability_of(plugin)
    allowed = {name.lower() for name in engine["source-runtime.managed-connectors"]}
    if (
        capability is None
        or not engine["source-runtime.managed-enabled"]
        or plugin.name.lower() not in allowed
    ):
        return LEGACY
    return SourceRuntime(Lane.MANAGED, capability.digest)


def check_restore(recorded: SourceRuntime, plugin: type) -> SourceRuntime:
    """The lane a restore runs in: always the recorded one. Lane A needs the same capability
    digest as recorded (LaneMismatch otherwise, before anything executes); the kill switch
    does not move a restored pipeline either way."""
    if recorded.lane == Lane.LEGACY:
        return recorded
    capability = capability_of(plugin)
    installed = capability.digest if capability is not None else None
    if installed != recorded.capability_digest:
        raise LaneMismatch(
            f"{plugin.name}: the checkpoint was taken in the managed lane with capability "
            f"{recorded.capability_digest}, the installed connector has "
            f"{installed or 'no managed capability'}; restore with a matching version"
        )
    return recorded


def check_snapshot_versions(
    metadata: dict, protocol_version: int, connector_state_version: int | None = None
) -> None:
    """A reader's snapshot is restored only by a runtime that reads every version it records:
    its runtime metadata's, the command protocol's, the managed lane's and (when the restoring
    reader's is given) its connector state's. A newer (or missing) one is refused before
    anything executes (LaneMismatch, naming the key), never read as if it were ours.

    Metadata of version 1 predates ``connectorStateVersion``: every managed reader's state was
    then at its version 1, so that is what a version 1 snapshot holds; from version 2 on the key
    is required."""
    for key, ours in (
        ("metadataVersion", RUNTIME_METADATA_VERSION),
        ("commandProtocolVersion", protocol_version),
        ("managedLaneVersion", MANAGED_LANE_VERSION),
    ):
        check_version(key, metadata.get(key), ours, "the checkpoint's source runtime metadata")
    if connector_state_version is not None:
        theirs = metadata.get("connectorStateVersion")
        if theirs is None and metadata.get("metadataVersion") == 1:
            theirs = 1
        check_version(
            "connectorStateVersion",
            theirs,
            connector_state_version,
            "the checkpoint's source runtime metadata",
        )


def check_enumerator_state(state: dict) -> None:
    """An enumerator's checkpointed state is restored only if this engine reads its version
    (``enumeratorStateVersion``; state of this release written before the key existed holds a
    tracker no proof can read, so a missing one is refused too)."""
    check_version(
        "enumeratorStateVersion",
        state.get("enumeratorStateVersion"),
        ENUMERATOR_STATE_VERSION,
        "the checkpoint's enumerator state",
    )


def check_version(key: str, theirs, ours: int, where: str) -> None:
    """LaneMismatch unless ``theirs`` is a version from 1 to ``ours``."""
    if not isinstance(theirs, int) or isinstance(theirs, bool) or not 1 <= theirs <= ours:
        raise LaneMismatch(
            f"{where} has {key} {theirs!r}; this engine reads 1 to {ours}: restore with a "
            "compatible version"
        )
