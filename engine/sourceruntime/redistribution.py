"""Rescale of a Lane A pipeline's checkpointed source state: the splits its old readers held,
with their offsets, dealt to the new readers by split id, never by old reader index.

A rescale restores from a completed checkpoint at another parallelism. What each old reader's
snapshot there holds (its connector state: ``splits``, ``offsets`` and, in LocalFile's state of
version 1, ``done``) is pooled and dealt again: the held split ids in sorted order, the k-th to
new reader k mod N (balanced, and the same answer for the same splits whoever held them). The
enumerator's cut is reconciled first with what each old reader's runtime metadata proves, as a
restore does (engine.sourceruntime.tracker): proven assignments are the readers' (they leave
the tracker), the rest returns to the pending splits; so no tracked entry names a reader index
any more, and the new readers' metadata starts without lineage or watermarks. The assignments
the old readers applied that the enumerator's cut may not know (``recentAssignments``) go to new
reader 0, whose registration and restore keep them out of the pending splits and the
discovery's new files.
"""

from __future__ import annotations

import json
from typing import Any

from engine.sourceruntime.ownership import recent_split_ids
from engine.sourceruntime.tracker import AssignmentTracker, Proof

#: The connector-state keys this module knows how to deal by split id (``SplitOffsets``').
STATE_KEYS = frozenset({"splits", "offsets", "done"})
#: Metadata keys copied from the old snapshots (the newest version among them).
VERSION_KEYS = ("metadataVersion", "commandProtocolVersion", "managedLaneVersion")


class NotRedistributable(ValueError):
    """The checkpoint's reader state cannot be dealt by split id (an unknown shape, or a split
    two old readers both hold)."""


def owners(split_ids: set[str], parallelism: int) -> dict[str, int]:
    """Each split's new reader: the ids in sorted order, dealt round the ``parallelism``
    readers."""
    if parallelism < 1:
        raise ValueError("parallelism must be at least 1")
    return {split_id: n % parallelism for n, split_id in enumerate(sorted(split_ids))}


def _held(state: dict) -> set[str]:
    unknown = set(state) - STATE_KEYS
    if unknown:
        raise NotRedistributable(f"reader state has keys {sorted(unknown)} it cannot deal")
    ids = {s["splitId"] for s in state.get("splits") or ()}
    return ids | set(state.get("offsets") or {}) | set(state.get("done") or ())


def redistribute(old: dict[int, dict | None], parallelism: int) -> dict[int, dict | None]:
    """The old readers' managed snapshots (``{"state", "metadata"}`` by old reader index; None
    or empty for a reader without one) dealt to ``parallelism`` new readers: their snapshots
    by new index, None for every one when no old reader had a snapshot. Every split an old
    reader held is held by exactly one new reader, with its offset."""
    snapshots = {index: snap for index, snap in old.items() if snap}
    if not snapshots:
        return dict.fromkeys(range(parallelism))
    whose: dict[str, int] = {}
    for index, snap in sorted(snapshots.items()):
        for split_id in _held(snap.get("state") or {}):
            if split_id in whose:
                raise NotRedistributable(
                    f"split {split_id} is held by readers {whose[split_id]} and {index}"
                )
            whose[split_id] = index
    owner = owners(set(whose), parallelism)
    new_states: list[dict[str, Any]] = [{"splits": [], "offsets": {}} for _ in range(parallelism)]
    for snap in snapshots.values():
        state = snap.get("state") or {}
        for split in state.get("splits") or ():
            new_states[owner[split["splitId"]]]["splits"].append(split)
        for split_id, offset in (state.get("offsets") or {}).items():
            new_states[owner[split_id]]["offsets"][split_id] = offset
        for split_id in state.get("done") or ():
            new_states[owner[split_id]].setdefault("done", []).append(split_id)
    for state in new_states:
        state["splits"].sort(key=lambda s: s["splitId"])
        if "done" in state:
            state["done"].sort()
    metadata = [_metadata(snapshots.values()) for _ in range(parallelism)]
    metadata[0]["recentAssignments"] = [
        entry
        for _, snap in sorted(snapshots.items())
        for entry in (snap.get("metadata") or {}).get("recentAssignments") or ()
    ]
    schema = _schema(snapshots)
    return {
        index: {
            "state": new_states[index],
            "metadata": metadata[index],
            **({"schema": schema} if schema is not None else {}),
        }
        for index in range(parallelism)
    }


def _schema(snapshots: dict[int, dict]) -> Any:
    """The schema the old readers' rows were of when a schema change made it other than the
    plan's (their snapshots' ``schema``): every new reader's; readers that disagree (a change
    under way) cannot be rescaled."""
    found = {json.dumps(snap.get("schema"), sort_keys=True) for snap in snapshots.values()}
    if len(found) > 1:
        raise NotRedistributable("the readers' schemas differ: a schema change is under way")
    return next(iter(snapshots.values())).get("schema")


def _metadata(snapshots) -> dict:
    """A new reader's runtime metadata: the old snapshots' versions and capability, no attempt
    lineage and no applied watermarks (no tracked assignment names its index: the enumerator's
    cut was reconciled), no recent assignments (new reader 0 takes them all)."""
    known = [s.get("metadata") or {} for s in snapshots]
    newest = max(known, key=lambda m: m.get("metadataVersion") or 0)
    return {
        **{key: newest[key] for key in VERSION_KEYS if key in newest},
        "connectorStateVersion": max(m.get("connectorStateVersion") or 1 for m in known),
        "readerAttemptLineage": [],
        "appliedSenderWatermarks": {},
        "recentAssignments": [],
        "noMoreSplitsGeneration": max(m.get("noMoreSplitsGeneration") or 0 for m in known),
        "capabilityDigest": newest.get("capabilityDigest"),
    }


def reconcile_enumerator(own: dict, metadata: dict[int, dict | None]) -> dict:
    """The enumerator's managed state (``tracker``, ``pending``, ``splits``, ``known``...)
    reconciled with its old readers' runtime metadata (by old reader index), as its restore
    would: what a reader's metadata proves leaves the tracker (the reader's state holds it, or
    it was read to its end), the rest tracked for a reader returns to the pending splits, and
    the splits the readers' recent assignments name are not pending. The tracker keeps no
    entry that names a reader."""
    tracker = AssignmentTracker.from_json(own["tracker"])
    returned: list[str] = []
    for index in sorted({e.reader for e in tracker.entries.values()} - {None}):
        returned += tracker.reconcile(index, Proof.of(metadata.get(index)))
    held = set().union(*(recent_split_ids(m) for m in metadata.values()))
    pending = list(dict.fromkeys(s for s in [*own["pending"], *returned] if s not in held))
    keep = {*pending, *tracker.entries}
    return {
        **own,
        "tracker": tracker.to_json(),
        "pending": pending,
        "splits": {s: split for s, split in own["splits"].items() if s in keep},
    }


def adopted_writers(old: dict[int, list[int]], old_parallelism: int, parallelism: int):
    """Which new reader settles the sinks of each old reader index that no longer runs (its
    sink commits of the checkpoint restored from are applied once, by that reader, before it
    reads): index j goes to new reader j mod ``parallelism``. ``old``: what each old reader
    adopted already (a rescale again before a checkpoint of the new readers completed)."""
    gone = {j for j in range(parallelism, old_parallelism)}
    gone |= {j for adopted in old.values() for j in adopted if j >= parallelism}
    out: dict[int, list[int]] = {index: [] for index in range(parallelism)}
    for j in sorted(gone):
        out[j % parallelism].append(j)
    return out
