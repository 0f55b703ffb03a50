"""A backlog waits on disk, not in the enumerator: a LocalFile scan hands on at most the room
the enumerator has for pending splits, the oldest files first, and leaves the rest for a later
scan, however long they wait (the watermark stays below them, past the window's age too); a
restore from a cut taken meanwhile finds them; a BATCH job's one scan goes again until every
file was handed on, and only then is its discovery complete."""

from __future__ import annotations

from pathlib import Path

from engine.sourceruntime.arrivals import ArrivalWindow, Verdict
from tests.discoverykit import Discovered, wait_past, write

MAX_FILE_AGE_MS = 200


class Room:
    """The enumerator's room for new splits, as the test sets it."""

    def __init__(self, splits: int) -> None:
        self.splits = splits

    def __call__(self) -> int:
        return self.splits


def backlog(directory: Path, count: int) -> list[tuple[int, str]]:
    """``count`` files written in reverse name order (so name order is not arrival order):
    (ctime, name) of each, oldest first."""
    names = [f"f-{n:03d}.csv" for n in reversed(range(count))]
    return sorted((write(directory / name), name) for name in names)


def names(splits: list[dict]) -> list[str]:
    return [s["relativePath"] for s in splits]


def test_a_scan_hands_on_the_oldest_files_it_has_room_for_and_the_rest_wait(tmp_path):
    files = backlog(tmp_path, 25)
    room = Room(10)
    kit = Discovered(tmp_path, MAX_FILE_AGE_MS, room=room)
    try:
        first = kit.scan()
        assert sorted(names(first)) == sorted(name for _, name in files[:10])
        assert kit.discovery.metrics()["heldBack"] == 15
        # Long past the window's age: a watermark that trailed the scan would leave the rest
        # below it for ever.
        wait_past(files[-1][0] + MAX_FILE_AGE_MS * 1_000_000)
        room.splits = 0
        assert kit.scan() == []
        room.splits = 10
        assert sorted(names(kit.scan())) == sorted(name for _, name in files[10:20])
        assert kit.discovery.metrics()["heldBack"] == 5
        room.splits = 100
        assert sorted(names(kit.scan())) == sorted(name for _, name in files[20:])
        assert kit.discovery.metrics()["heldBack"] == 0
        assert kit.scan() == []
        assert sorted(names(kit.handed)) == sorted(name for _, name in files)  # each once
        # What it remembers is still the window's: the files older than its age are gone.
        write(tmp_path / "late.csv")
        assert names(kit.scan()) == ["late.csv"]
        assert kit.discovery.metrics()["known"] == 1
    finally:
        kit.close()


def test_a_restore_from_a_cut_taken_while_files_waited_finds_them(tmp_path):
    files = backlog(tmp_path, 12)
    first = Discovered(tmp_path, MAX_FILE_AGE_MS, room=Room(5))
    handed = first.scan()
    cut = first.discovery.snapshot()
    first.close()
    wait_past(files[-1][0] + MAX_FILE_AGE_MS * 1_000_000)

    second = Discovered(tmp_path, MAX_FILE_AGE_MS, room=Room(100))
    second.discovery.restore(cut, [s["splitId"] for s in handed[:2]])  # two reached a reader
    try:
        # The cut's hand-ons are the enumerator's (its pending splits and tracker, restored
        # with it); the files that waited on disk are new.
        assert sorted(names(second.scan())) == sorted(name for _, name in files[5:])
    finally:
        second.close()


def test_a_batch_scan_goes_again_until_every_file_was_handed_on(tmp_path):
    files = backlog(tmp_path, 7)
    kit = Discovered(tmp_path, MAX_FILE_AGE_MS, interval=None, room=Room(3))
    try:
        assert len(kit.scan()) == 3 and not kit.discovery.complete
        assert len(kit.scan()) == 3 and not kit.discovery.complete
        assert len(kit.scan()) == 1 and kit.discovery.complete
        assert kit.scan() == []
        assert sorted(names(kit.handed)) == sorted(name for _, name in files)
    finally:
        kit.close()


def test_a_file_left_for_later_is_not_learnt(tmp_path):
    """A file changed in place that a scan leaves for later is still new to the next one."""
    window = ArrivalWindow(0)
    window.remember("a.csv", "file:a.csv@1:7", 1, 7)
    assert window.peek("a.csv", 5, 7) == Verdict.CHANGED
    assert window.peek("a.csv", 5, 7) == Verdict.CHANGED  # peeking learnt nothing
    assert window.judge("a.csv", 5, 7) == Verdict.CHANGED
    assert window.judge("a.csv", 5, 7) == Verdict.SAME
    window.advance(started=100, held=5)
    assert window.watermark == 5 and "a.csv" in window.entries


def test_without_room_the_discovery_hands_on_every_file(tmp_path):
    """Without a bound (FileDiscovery's default) a scan hands on what it found."""
    backlog(tmp_path, 30)
    kit = Discovered(tmp_path, MAX_FILE_AGE_MS)
    try:
        assert len(kit.scan()) == 30 and kit.discovery.metrics()["heldBack"] == 0
    finally:
        kit.close()
