"""A file system may give a new file the inode of one deleted a moment before (ext4 does at
once): a new file renamed in under a deleted file's name can then look like the old file changed
in place. Name, inode and ctime together name an arrival, so it is handed on as a split of its
own, never taken for the file read before."""

from __future__ import annotations

import os

from engine.sourceruntime.arrivals import ArrivalWindow, Verdict
from tests.discoverykit import Discovered, rename_in, wait_past, write

#: Long enough that no file of the test leaves the window, however slow the machine.
KEPT_MS = 60_000


def test_a_newer_ctime_under_a_known_name_and_inode_is_a_new_arrival():
    window = ArrivalWindow(KEPT_MS * 1_000_000)
    assert window.judge("a.csv", 100, 7) == Verdict.NEW
    window.remember("a.csv", "file:a.csv@100:7", 100, 7)
    assert window.judge("a.csv", 100, 7) == Verdict.SAME
    assert window.judge("a.csv", 200, 7) == Verdict.CHANGED  # the inode reused, or written
    window.remember("a.csv", "file:a.csv@200:7", 200, 7)
    assert window.entries["a.csv"].split_id == "file:a.csv@200:7"
    assert window.judge("a.csv", 200, 7) == Verdict.SAME


def test_a_new_file_renamed_in_under_a_deleted_file_s_name_is_read(tmp_path):
    root, staging = tmp_path / "in", tmp_path / "staging"
    root.mkdir()
    staging.mkdir()
    kit = Discovered(root, KEPT_MS)
    try:
        written = write(root / "a.csv", rows=2)
        (first,) = kit.scan()
        inode = (root / "a.csv").stat().st_ino
        os.remove(root / "a.csv")
        wait_past(written + 20_000_000)  # a timestamp tick later, on any kernel
        write(staging / "a.csv", rows=5)  # ext4 hands it the freed inode
        rename_in(staging / "a.csv", root / "a.csv")
        (again,) = kit.scan()
        assert again["relativePath"] == "a.csv" and again["splitId"] != first["splitId"]
        reused = (root / "a.csv").stat().st_ino == inode
        metrics = kit.discovery.metrics()
        assert (metrics["changed"], metrics["replaced"]) == ((1, 0) if reused else (0, 1))
        assert kit.scan() == []
    finally:
        kit.close()
