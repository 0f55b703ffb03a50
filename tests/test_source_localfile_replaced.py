"""A LocalFile split names its file by path, ctime and inode. A file replaced under the same
name (renamed over it) before the reader opens the split, or between a restore and the reopen
at its offset, is another split, which the discovery hands on by its own id: the old split ends
with nothing more read (counted), never reading the new file's records under the old id."""

from __future__ import annotations

import os
from pathlib import Path

from engine.connectors.localfile import LocalFileSource
from engine.connectors.localfile_managed import Found, ManagedLocalFileReader, split_for
from engine.sourceruntime.limits import PollLimits
from engine.states import JobMode
from tests.discoverykit import rename_in, wait_past
from tests.localfilekit import source_in
from tests.source_conformance import read_all, turn


def write(path: Path, first: int, rows: int) -> dict:
    """The file, and the split the discovery would hand on for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{i},n{i}\n" for i in range(first, first + rows)))
    stat = path.stat()
    return split_for(Found(path.name, str(path), stat.st_ctime_ns, stat.st_ino))


def replace(path: Path, staging: Path, first: int, rows: int) -> dict:
    """A new file renamed over ``path``: its split."""
    wait_past(path.stat().st_ctime_ns + 20_000_000)  # a timestamp tick later, on any kernel
    write(staging / path.name, first, rows)
    rename_in(staging / path.name, path)
    stat = path.stat()
    return split_for(Found(path.name, str(path), stat.st_ctime_ns, stat.st_ino))


def reader_of(source: LocalFileSource, *splits: dict) -> ManagedLocalFileReader:
    reader = ManagedLocalFileReader(source, JobMode.BATCH)
    reader.add_splits(list(splits))
    reader.notify_no_more_splits()
    return reader


def test_a_file_replaced_before_its_split_is_opened_is_not_read_under_the_old_id(tmp_path):
    root = tmp_path / "in"
    old = write(root / "a.csv", 0, 5)
    new = replace(root / "a.csv", tmp_path / "staging", 100, 3)
    assert new["splitId"] != old["splitId"]
    source = source_in(root)
    reader = reader_of(source, old)
    assert read_all(reader) == []
    assert reader.splits == {} and reader.metrics()["replacedBeforeRead"] == 1
    again = reader_of(source, new)  # the discovery hands the new file on by its own id
    assert [row[0] for row in read_all(again)] == [100, 101, 102]
    assert again.metrics()["replacedBeforeRead"] == 0


def test_a_file_replaced_between_a_restore_and_the_reopen_ends_its_split(tmp_path):
    root = tmp_path / "in"
    old = write(root / "a.csv", 0, 5)
    source = source_in(root)
    reader = reader_of(source, old)
    _, records = turn(reader, PollLimits(max_records=2))
    assert [row[0] for row in records] == [0, 1]
    state = reader.snapshot()
    replace(root / "a.csv", tmp_path / "staging", 100, 5)
    restored = ManagedLocalFileReader(source, JobMode.BATCH)
    restored.restore(state)
    restored.notify_no_more_splits()
    assert read_all(restored) == []
    assert restored.splits == {} and restored.metrics()["replacedBeforeRead"] == 1


def test_a_split_of_the_earlier_id_form_is_read_whatever_its_file_is_now(tmp_path):
    root = tmp_path / "in"
    write(root / "a.csv", 0, 5)
    replace(root / "a.csv", tmp_path / "staging", 100, 2)
    source = source_in(root)
    legacy = {"splitId": "file:a.csv", "path": str(root / "a.csv"), "relativePath": "a.csv"}
    reader = reader_of(source, legacy)
    assert [row[0] for row in read_all(reader)] == [100, 101]
    assert reader.metrics()["replacedBeforeRead"] == 0
    assert os.path.exists(root / "a.csv")
