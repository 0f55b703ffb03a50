"""What a LocalFile discovery takes for a new file: a file's arrival is its ctime (set by the
kernel when it is created or renamed in, whatever its mtime says), its identity its inode. A new
file under a known name is a split of its own; so is a known file changed in place (a newer
ctime: read again, at least once, counted); a directory moved in brings files whose ctime is
older than the watermark, which are left out and counted, as the docs say."""

from __future__ import annotations

import os

from tests.discoverykit import Discovered, rename_in, wait_past, write

MAX_FILE_AGE_MS = 200
AGE_NS = MAX_FILE_AGE_MS * 1_000_000
DAY_NS = 86_400 * 10**9
#: Long enough that no file of the test leaves the window, however slow the machine.
KEPT_MS = 60_000


def test_a_file_replaced_under_its_name_is_new_and_one_changed_in_place_is_read_again(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    kit = Discovered(root, KEPT_MS)
    try:
        write(root / "a.csv")
        written = write(root / "b.csv")
        first = {s["relativePath"]: s["splitId"] for s in kit.scan()}
        assert sorted(first) == ["a.csv", "b.csv"]
        write(tmp_path / "staging" / "a.csv", rows=3)
        rename_in(tmp_path / "staging" / "a.csv", root / "a.csv")  # a new inode, same name
        wait_past(written + 20_000_000)  # a timestamp tick later, on any kernel
        with open(root / "b.csv", "a") as appended:
            appended.write("7\n")  # same inode, its ctime moves
        again = {s["relativePath"]: s["splitId"] for s in kit.scan()}
        assert sorted(again) == ["a.csv", "b.csv"]
        assert again["a.csv"] != first["a.csv"] and again["b.csv"] != first["b.csv"]
        metrics = kit.discovery.metrics()
        assert (metrics["replaced"], metrics["changed"]) == (1, 1)
        assert kit.scan() == []
    finally:
        kit.close()


def test_a_file_renamed_in_is_found_by_its_ctime_whatever_its_mtime(tmp_path):
    root = tmp_path / "in"
    newest = write(root / "x.csv")
    kit = Discovered(root, MAX_FILE_AGE_MS)
    try:
        assert len(kit.scan()) == 1
        staged = tmp_path / "staging" / "y.csv"
        write(staged)
        day_ago = newest - DAY_NS
        os.utime(staged, ns=(day_ago, day_ago))  # as `mv` or `cp -p` keep an old mtime
        wait_past(newest + AGE_NS)
        assert kit.scan() == []  # the watermark is past x.csv's ctime and far past y's mtime
        rename_in(staged, root / "y.csv")
        assert [s["relativePath"] for s in kit.scan()] == ["y.csv"]
    finally:
        kit.close()


def test_files_of_a_directory_moved_in_below_the_watermark_are_counted_not_read(tmp_path):
    root = tmp_path / "in"
    moved = write(tmp_path / "staging" / "d" / "f.csv")
    newest = write(root / "x.csv")
    wait_past(max(moved, newest) + AGE_NS)
    kit = Discovered(root, MAX_FILE_AGE_MS)
    try:
        assert [s["relativePath"] for s in kit.scan()] == ["x.csv"]
        rename_in(tmp_path / "staging" / "d", root / "d")  # f.csv keeps its ctime
        assert kit.scan() == []
        # Both are below the watermark: x.csv handed on before, d/f.csv arrived too late.
        assert kit.discovery.metrics()["older"] == 2
    finally:
        kit.close()
