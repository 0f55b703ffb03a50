"""LocalFile's reader keeps at most MAX_OPEN_FILES files open at once, however many unfinished
files it holds: the least recently read one is closed and opened again at its offset on its next
turn, so a storm of large files cannot exhaust the process's file descriptors, and every record
is still read exactly once."""

from __future__ import annotations

import os
from pathlib import Path

from engine.connectors.batches import limits
from engine.connectors.localfile_managed import MAX_OPEN_FILES, ManagedLocalFileReader
from engine.sourceruntime.choices import PollStatus
from engine.states import JobMode
from tests.localfilekit import source_in
from tests.source_conformance import turn

FILES = MAX_OPEN_FILES + 4


def open_under(directory: Path) -> int:
    """This process's file descriptors open on files under ``directory``."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory))
        except OSError:
            continue  # closed since it was listed
    return found


def test_at_most_max_open_files_are_open_and_every_record_is_read_once(tmp_path):
    rows = limits()[0] + 7  # more than one block: each file stays unfinished for a while
    for f in range(FILES):
        (tmp_path / f"f{f:02}.csv").write_text("".join(f"{f * rows + i},n\n" for i in range(rows)))
    source = source_in(tmp_path)
    reader = ManagedLocalFileReader(source, JobMode.BATCH)
    reader.add_splits(source.create_splits(JobMode.BATCH))
    reader.notify_no_more_splits()
    ids, most = [], 0
    for _ in range(100_000):
        status, records = turn(reader)
        ids += [row[0] for row in records]
        most = max(most, open_under(tmp_path))
        assert len(reader._reading) <= MAX_OPEN_FILES
        if status != PollStatus.MORE_AVAILABLE:
            break
    assert status == PollStatus.END_OF_INPUT
    assert sorted(ids) == list(range(FILES * rows))  # each record once, none lost
    assert 0 < most <= MAX_OPEN_FILES
    assert reader.metrics()["reopened"] > 0 and open_under(tmp_path) == 0
