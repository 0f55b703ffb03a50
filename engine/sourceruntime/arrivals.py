"""What a listing discovery (files in a directory) remembers of the items it handed on: not
every item ever seen, but a window of recent arrivals above a watermark.

Each item has a name (its path under the source), an arrival stamp (ns; for files the ctime,
which the kernel sets when a file is created, renamed in or written, and which no user can set)
and an identity (for files the inode). A listing that started at ``started`` saw every item whose
stamp is older than ``started - margin`` (the margin covers the clock's granularity, a write in
progress and a clock stepped back), so once its result is applied the watermark moves up to
there: entries below it are dropped (compacted), and items below it are left out of later
listings (counted). The entries kept are the items that arrived within ``margin`` of the latest
listing: the window grows with the arrival rate, never with the items ever seen.

An item whose name is known under another identity replaced the known one (a new file under the
same name): it is new. One whose stamp moved but not its identity is new too: a file system may
give a new file the identity of one deleted a moment before (ext4 reuses inodes at once), so
name, identity and stamp together name an arrival, and an item changed in place after it was
handed on is handed on again (at least once, never lost; counted). The checkpointed form is
versioned (``knownVersion``); a restore refuses a version it cannot read, naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from engine.sourceruntime.capability import LaneMismatch

#: The checkpointed form of a discovery's known items (and the key that names it).
KNOWN_VERSION = 1
VERSION_KEY = "knownVersion"


def check_known_version(state: dict) -> None:
    """A discovery restores only a form it reads: a newer (or missing) version is refused before
    anything runs (LaneMismatch, naming the key), never read as if it were ours."""
    theirs = state.get(VERSION_KEY)
    if not isinstance(theirs, int) or isinstance(theirs, bool) or not 1 <= theirs <= KNOWN_VERSION:
        raise LaneMismatch(
            f"the enumerator's checkpoint holds its discovery's known splits with {VERSION_KEY} "
            f"{theirs!r}; this engine reads 1 to {KNOWN_VERSION}: restore with a compatible version"
        )


class Verdict(StrEnum):
    NEW = "NEW"  # never handed on (as far as the window knows): hand it on
    REPLACED = "REPLACED"  # a known name under another identity: a new item, handed on
    SAME = "SAME"  # known as it is
    CHANGED = "CHANGED"  # known identity, its stamp moved: a new arrival, handed on again
    OLDER = "OLDER"  # below the watermark: handed on before, or arrived too late


@dataclass
class Arrival:
    split_id: str
    stamp: int  # ns: the newest stamp seen
    identity: int | None  # None: an entry of the earlier, unversioned form (any identity)


class ArrivalWindow:
    """Known items by name while their stamp is at or above the watermark (None: nothing was
    listed yet, every item is new). Only the coordinator loop touches it; a listing gets
    ``frozen()``, an immutable copy."""

    def __init__(self, margin_ns: int) -> None:
        self.margin = margin_ns
        self.watermark: int | None = None
        self.entries: dict[str, Arrival] = {}
        self.compacted = 0  # entries dropped below the watermark, in this process

    def frozen(self) -> Mapping[str, tuple[int | None, int]]:
        """Name -> (identity, stamp): what a listing may leave out as known already."""
        return MappingProxyType({n: (a.identity, a.stamp) for n, a in self.entries.items()})

    def peek(self, name: str, stamp: int, identity: int) -> Verdict:
        """What ``judge`` would say, changing nothing: a listing may leave an item for a later
        one (a bound on what waits to be assigned), and then must not have learnt it."""
        if self.watermark is not None and stamp < self.watermark:
            return Verdict.OLDER
        known = self.entries.get(name)
        if known is None:
            return Verdict.NEW
        if known.identity is not None and known.identity != identity:
            return Verdict.REPLACED
        adopted = known.identity is None
        return Verdict.CHANGED if stamp > known.stamp and not adopted else Verdict.SAME

    def judge(self, name: str, stamp: int, identity: int) -> Verdict:
        """What an item a listing found is; a known one's stamp and identity are brought up to
        date. A newer stamp under a known identity is a new arrival: the identity may be a
        deleted item's, reused (CHANGED, handed on like REPLACED)."""
        verdict = self.peek(name, stamp, identity)
        if verdict in (Verdict.SAME, Verdict.CHANGED):
            known = self.entries[name]
            known.stamp, known.identity = max(known.stamp, stamp), identity
        return verdict

    def remember(self, name: str, split_id: str, stamp: int, identity: int | None) -> None:
        """An item handed on (or held by a reader): kept unless a newer arrival holds its name
        or it is below the watermark already."""
        if self.watermark is not None and stamp < self.watermark:
            return
        known = self.entries.get(name)
        if known is None or known.stamp <= stamp:
            self.entries[name] = Arrival(split_id, stamp, identity)

    def advance(self, started: int, held: int | None = None) -> int:
        """A listing that started at ``started`` (ns) was applied: the watermark moves up to
        ``started - margin`` (never down) and the entries below it go. Returns how many.
        ``held``: the oldest stamp of the items the listing left for a later one; the
        watermark stays at or below it, so a later listing finds them again."""
        floor = started - self.margin
        if held is not None:
            floor = min(floor, held)
        if self.watermark is None or floor > self.watermark:
            self.watermark = floor
        below = [n for n, a in self.entries.items() if a.stamp < self.watermark]
        for name in below:
            del self.entries[name]
        self.compacted += len(below)
        return len(below)

    def to_json(self) -> dict:
        return {
            VERSION_KEY: KNOWN_VERSION,
            "watermark": self.watermark,
            "items": [
                [name, a.split_id, a.stamp, a.identity] for name, a in sorted(self.entries.items())
            ],
        }

    @classmethod
    def from_json(cls, state: dict, margin_ns: int) -> ArrivalWindow:
        check_known_version(state)
        window = cls(margin_ns)
        window.watermark = state["watermark"]
        window.entries = {
            name: Arrival(split_id, stamp, identity)
            for name, split_id, stamp, identity in state["items"]
        }
        return window
