"""What a reader's runtime metadata records so that its enumerator can tell which splits are the
reader's, without reading the connector's state: its attempt lineage, and the assignments it
applied that the enumerator's checkpointed cut may not know yet.

The enumerator's snapshot and a reader's are taken at different moments of a checkpoint: a
split assigned after the enumerator's snapshot may be in the reader's, so a restore from that
checkpoint finds the split in neither the enumerator's cut nor (if the reader has read it to
its end and dropped it) the connector's state. The reader therefore keeps each assignment it
applied (sender, sequence, split ids) in its metadata until that can no longer happen: once a
checkpoint whose snapshot held it has completed, every later checkpoint was triggered after
that (a pipeline has one checkpoint in flight at a time), so after the assignment was sent,
and its enumerator cut knows the split. Bounds: the entries applied since the reader last saw
a checkpoint complete that included them, which the enumerator's tracker bounds in turn
(``engine.source-runtime.tracker.max-entries``: an assignment leaves it only once a completed
checkpoint proves it); the lineage keeps the last ``LINEAGE_MAX`` attempts (every restore
reconciles the tracker, so no tracked assignment targets an attempt older than the previous).
"""

from __future__ import annotations

#: Reader attempts a snapshot's lineage keeps, newest last.
LINEAGE_MAX = 8


def lineage_of(restored: list[int] | None, attempt: int) -> list[int]:
    """The restored lineage and this attempt, the newest ``LINEAGE_MAX``."""
    return [*(restored or []), attempt][-LINEAGE_MAX:]


def recent_split_ids(metadata: dict | None) -> set[str]:
    """The split ids a snapshot's ``recentAssignments`` name (metadata of version 1 has none)."""
    return {
        split_id
        for _, _, split_ids in (metadata or {}).get("recentAssignments") or ()
        for split_id in split_ids
    }


class RecentAssignments:
    """The assignments a reader applied, each until a completed checkpoint that included it is
    known to this attempt (a ``CHECKPOINT_COMPLETE`` control, or its commits' own look-up)."""

    def __init__(self) -> None:
        #: [sender, sequence, split ids, the first checkpoint of this attempt that held it]
        self.entries: list[list] = []

    def applied(self, sender: int, sequence: int, split_ids: list[str]) -> None:
        self.entries.append([sender, sequence, split_ids, None])

    def snapshotted(self, checkpoint: int) -> None:
        for entry in self.entries:
            if entry[3] is None:
                entry[3] = checkpoint

    def completed(self, checkpoint: int) -> None:
        """Checkpoint ``checkpoint`` completed: what it (or an earlier one) held is released;
        snapshots from now on are of checkpoints triggered after it completed."""
        self.entries = [e for e in self.entries if e[3] is None or e[3] > checkpoint]

    def to_json(self) -> list[list]:
        return [[sender, sequence, ids] for sender, sequence, ids, _ in self.entries]

    def restore(self, data: list[list] | None) -> None:
        """A restored snapshot's entries: kept until a checkpoint of this attempt holds them
        and completes (the enumerator may not have reconciled them into its cut before)."""
        self.entries = [[sender, sequence, list(ids), None] for sender, sequence, ids in data or ()]

    def __len__(self) -> int:
        return len(self.entries)
