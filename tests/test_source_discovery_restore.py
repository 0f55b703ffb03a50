"""A restored LocalFile discovery hands on nothing its cut or its readers hold, though its
snapshot was compacted (files older than its window are no longer named in it), and still finds
the files handed on after the cut that no reader held, and new ones. Its checkpointed form is
versioned: a version it cannot read is refused, naming the key; the earlier list of split ids
is still read."""

from __future__ import annotations

import pytest

from engine.connectors.localfile_managed import FileDiscovery
from engine.sourceruntime.arrivals import VERSION_KEY
from engine.sourceruntime.capability import LaneMismatch
from engine.sourceruntime.coordinator import CoordinatorEventLoop, SharedWorkerPool
from engine.sourceruntime.discovery import FixedSplits
from tests.discoverykit import Discovered, source_in, wait_past, write

MAX_FILE_AGE_MS = 1000


def files(directory, prefix: str, count: int = 10) -> tuple[list[str], int]:
    names = [f"{prefix}-{n:02d}.csv" for n in range(count)]
    return names, max(write(directory / name) for name in names)


def test_a_restore_from_a_compacted_cut_rediscovers_nothing_handed_on(tmp_path):
    first = Discovered(tmp_path, MAX_FILE_AGE_MS)
    old, old_newest = files(tmp_path, "old")
    assert sorted(s["relativePath"] for s in first.scan()) == old
    wait_past(old_newest + MAX_FILE_AGE_MS * 1_000_000)  # "old" leaves the window
    cut_names, _ = files(tmp_path, "cut")
    assert len(first.scan()) == 10
    cut = first.discovery.snapshot()  # the enumerator's cut: compacted
    assert [name for name, *_ in cut["items"]] == cut_names
    after, _ = files(tmp_path, "after")
    handed_after = first.scan()  # handed on after the cut: half reached a reader before its barrier
    assert sorted(s["relativePath"] for s in handed_after) == after
    held = {s["splitId"] for s in handed_after[:5]} | {s["splitId"] for s in first.handed[:3]}
    first.close()

    # A new epoch's discovery, as the enumerator restores it: the cut, and what the readers'
    # snapshots in the same checkpoint hold.
    second = Discovered(tmp_path, MAX_FILE_AGE_MS)
    second.discovery.restore(cut, held)
    try:
        again = second.scan()
        # Only what was handed on after the cut and that no reader held: rolled back with it.
        assert sorted(s["splitId"] for s in again) == sorted(s["splitId"] for s in handed_after[5:])
        write(tmp_path / "new.csv")
        assert [s["relativePath"] for s in second.scan()] == ["new.csv"]
        assert second.scan() == []
    finally:
        second.close()


def test_the_earlier_list_of_split_ids_is_read(tmp_path):
    write(tmp_path / "a.csv")
    kit = Discovered(tmp_path, MAX_FILE_AGE_MS)
    try:
        kit.discovery.restore(["file:a.csv"])
        assert kit.scan() == []
        write(tmp_path / "b.csv")
        assert [s["relativePath"] for s in kit.scan()] == ["b.csv"]
    finally:
        kit.close()


@pytest.mark.parametrize("version", [2, None, "1", 0])
def test_a_known_version_this_engine_cannot_read_is_refused_naming_the_key(tmp_path, version):
    loop = CoordinatorEventLoop(SharedWorkerPool(1))
    files_state = {"watermark": 0, "items": []}
    fixed_state = {"splits": ["s1"]}
    if version is not None:
        files_state[VERSION_KEY] = fixed_state[VERSION_KEY] = version
    discoveries = [
        (FileDiscovery(source_in(tmp_path), loop, 1.0, lambda s: None), files_state),
        (FixedSplits(loop, lambda s: None, []), fixed_state),
    ]
    for discovery, state in discoveries:
        with pytest.raises(LaneMismatch, match=f"{VERSION_KEY} {version!r}; this engine reads"):
            discovery.restore(state)
    loop.pool.executor.shutdown()
