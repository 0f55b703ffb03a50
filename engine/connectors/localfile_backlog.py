"""A LocalFile managed reader's backlog: the files it holds and the bytes of them left to read,
reported to its enumerator as an ephemeral SOURCE_EVENT (engine.member.enumerator_link), which
assigns new files to the reader with the smallest backlog (engine.member.enumerator_backlog).

A file's size is its split's ``bytes`` (the discovery's stat) or, for a split described before
sizes were, its own stat, once. What of a file is read is known in records, not bytes: it is
estimated from the bytes per record of the files this reader read to their end (none yet: the
whole file counts as left). An estimate is enough, as nothing but the choice of a reader uses it,
and the report is never part of a checkpoint.

The report holds while the reader reads: a new one is made when its file count changes or its
bytes move by more than ``BYTES_CHANGE`` of the report's. The bytes left change with every poll
turn, and an event each turn (the link sends a changed one at every interval) would be a message
a second per reader for nothing: the held report stays within a tenth of the truth.
"""

from __future__ import annotations

import os

from engine.connectors.boundaries import resolve_file_path

#: The share of the held report's bytes the bytes left must move by for a new report.
BYTES_CHANGE = 0.1


class FileBacklog:
    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}  # by split id, while the reader holds the split
        self.read_bytes = self.read_records = 0  # of the files read to their end
        self.added = 0  # splits assigned to this reader attempt
        self.last: dict = {"files": 0, "bytes": 0}  # as last computed (the metrics')
        self.reported: dict | None = None  # the report held (what ``event`` returns)

    def size(self, split_id: str, split: dict) -> int:
        size = self.sizes.get(split_id)
        if size is None:
            size = split.get("bytes")
            if not isinstance(size, int):
                try:
                    size = os.stat(resolve_file_path(split["path"])).st_size
                except OSError:
                    size = 0  # gone or unreadable: its read reports the problem
            self.sizes[split_id] = size
        return size

    def finished(self, split_id: str, records: int) -> None:
        """The split leaves the reader: read to its end after ``records`` records, its size per
        record is learnt (a file left before any record was read teaches nothing)."""
        size = self.sizes.pop(split_id, None)
        if size and records > 0:
            self.read_bytes += size
            self.read_records += records

    def event(self, splits: dict[str, dict], offsets: dict[str, int]) -> dict:
        """The SOURCE_EVENT's payload: ``{"backlog": {"files": n, "bytes": b}}``, the report
        held unless its files changed or its bytes moved by more than ``BYTES_CHANGE``."""
        per_record = self.read_bytes / self.read_records if self.read_records else 0.0
        left = 0
        for split_id, split in splits.items():
            read = offsets.get(split_id, 0) * per_record
            left += max(self.size(split_id, split) - int(read), 0)
        self.last = {"files": len(splits), "bytes": left}
        held = self.reported
        if (
            held is None
            or held["files"] != len(splits)
            or abs(left - held["bytes"]) > BYTES_CHANGE * held["bytes"]
        ):
            self.reported = held = dict(self.last)
        return {"backlog": dict(held)}
