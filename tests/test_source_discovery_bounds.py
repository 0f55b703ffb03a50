"""A streaming LocalFile discovery's known files stay within their window (the files whose ctime
lies within ``file.discovery.max-file-age`` of its latest scan) however many files it has
seen: 2,000 files over 40 rounds leave at most one round's files in its checkpointed form, and
every file is handed on exactly once."""

from __future__ import annotations

import json
from collections import Counter

from tests.discoverykit import Discovered, wait_past, write

ROUNDS, PER_ROUND = 40, 50
MAX_FILE_AGE_MS = 30
#: A window entry's bytes in the checkpoint, at most (its path, split id, ctime and inode).
ENTRY_BYTES = 160


def test_known_files_stay_within_their_window_over_2000_files(tmp_path):
    kit = Discovered(tmp_path, MAX_FILE_AGE_MS)
    handed: list[dict] = []
    previous_newest = None
    try:
        for round_ in range(ROUNDS):
            names = [f"round={round_:02d}/f-{n:03d}.csv" for n in range(PER_ROUND)]
            newest = max(write(tmp_path / name) for name in names)
            if previous_newest is not None:
                # The previous round is older than the window when this scan starts.
                wait_past(previous_newest + MAX_FILE_AGE_MS * 1_000_000)
            found = kit.scan()
            assert sorted(s["relativePath"] for s in found) == names  # this round's, each once
            handed += found
            snapshot = kit.discovery.snapshot()
            size = len(json.dumps(snapshot))
            assert size <= PER_ROUND * ENTRY_BYTES, f"{size} bytes after {len(handed)} files"
            previous_newest = newest
        assert kit.scan() == []  # nothing new: nothing handed on
    finally:
        kit.close()
    assert len(handed) == ROUNDS * PER_ROUND
    assert max(Counter(s["relativePath"] for s in handed).values()) == 1
    assert len({s["splitId"] for s in handed}) == len(handed)
    # One round's files (those within the window), never the 2,000 seen.
    assert len(kit.discovery.snapshot()["items"]) <= PER_ROUND
    metrics = kit.discovery.metrics()
    assert metrics["known"] <= PER_ROUND
    assert metrics["compacted"] >= (ROUNDS - 1) * PER_ROUND
    assert metrics["older"] >= (ROUNDS - 1) * PER_ROUND  # files the last scan left to the mark
