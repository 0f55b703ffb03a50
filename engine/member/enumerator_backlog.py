"""A Lane A enumerator's view of its readers' backlogs, from their SOURCE_EVENTs: where new
splits go. Part of the enumerator task (engine.member.managed_enumerator), on its coordinator
loop; nothing of it is checkpointed (a restored enumerator assigns round-robin until its readers
report again).

Each reader that has ``source_event()`` (LocalFile's, engine.connectors.localfile_backlog)
reports the files it holds and the bytes of them left to read, at most every
``source-runtime.source-events.interval``. A report counts only if it comes from the reader's
registered attempt, under this enumerator's epoch (else it is ignored, and counted ``stale``);
between reports the splits assigned to the reader since are added to it (their ``bytes``, where
their description has them). A split goes to the reader with the smallest backlog (bytes, then
files) among those with room in their send window, once every one of them has reported; ties,
and readers without a report, go round-robin, as without events.

A reader whose report plus the splits assigned to it since reaches
``source-runtime.assignment.max-reader-splits`` gets no more until a report says it holds
fewer: a backlog waits in the enumerator's pending splits (bounded, with the rest on disk),
not in a reader's state and snapshots. A reader that never reports is not bounded by it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass
class Backlog:
    files: int
    bytes: int


class ReaderBacklogs:
    def __init__(self, max_files: int | None = None) -> None:
        self.max_files = max_files  # a reporting reader's bound on the splits it holds
        self.reported: dict[int, Backlog] = {}  # by reader index: its newest report
        self.since: dict[int, Backlog] = {}  # assigned to it since that report
        #: received (applied), stale, invalid, splits whose reader the backlogs chose
        #: (``byBacklog``: other than the round-robin turn's), and assignment passes that
        #: stopped with every reader with window room at its bound (``full``)
        self.counts: Counter[str] = Counter()

    def event(self, index: int, event: object, current: bool) -> None:
        """A reader's SOURCE_EVENT; ``current``: from its registered attempt, under this epoch."""
        if not current:
            self.counts["stale"] += 1
            return
        backlog = event.get("backlog") if isinstance(event, dict) else None
        files = backlog.get("files") if isinstance(backlog, dict) else None
        size = backlog.get("bytes") if isinstance(backlog, dict) else None
        if not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (files, size)
        ):
            self.counts["invalid"] += 1
            return
        self.counts["received"] += 1
        self.reported[index] = Backlog(files, size)
        self.since[index] = Backlog(0, 0)

    def assigned(self, index: int, split: dict) -> None:
        since = self.since.get(index)
        if since is not None:
            size = split.get("bytes")
            since.files += 1
            since.bytes += size if isinstance(size, int) else 0

    def full(self, index: int) -> bool:
        """Whether the reader holds its bound already (as far as its report and the splits
        assigned to it since say)."""
        if self.max_files is None or index not in self.reported:
            return False
        return self.reported[index].files + self.since[index].files >= self.max_files

    def choose(self, candidates: list[int]) -> int:
        """The reader for the next split: ``candidates`` (with room) in round-robin order."""
        if len(candidates) < 2 or any(c not in self.reported for c in candidates):
            return candidates[0]
        best = min(candidates, key=self.view)  # the first of equals: round-robin's
        if best != candidates[0]:
            self.counts["byBacklog"] += 1
        return best

    def view(self, index: int) -> tuple[int, int]:
        reported, since = self.reported[index], self.since[index]
        return reported.bytes + since.bytes, reported.files + since.files

    def forget(self, index: int) -> None:
        """A newer attempt of the reader registered: its backlog is reported afresh."""
        self.reported.pop(index, None)
        self.since.pop(index, None)

    def metrics(self) -> dict:
        return {
            key: self.counts.get(key, 0)
            for key in ("received", "stale", "invalid", "byBacklog", "full")
        }
