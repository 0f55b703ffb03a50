"""A backlog waits on disk, not in the enumerator: a LocalFile scan hands on at most the room
the enumerator has for pending splits, the oldest files first, and leaves the rest for a later
scan, however long they wait (the watermark stays below them, past the window's age too); a
restore from a cut taken meanwhile finds them; a file changed in place while it waits is
handed on later; a BATCH job's scan goes again (after a timeout too) until it handed on every
file there at its first look, and only then is its discovery complete."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from engine.sourceruntime.arrivals import ArrivalWindow, Verdict
from tests.discoverykit import Discovered, wait_past, write

MAX_FILE_AGE_MS = 200
#: Longer than the kernel's ctime granularity (a jiffy): a file written after this is newer.
TICK = 20_000_000


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
        assert kit.discovery.metrics()["known"] <= 1  # late.csv, unless a slow scan aged it
    finally:
        kit.close()


def test_a_restore_from_a_cut_taken_while_files_waited_finds_them(tmp_path):
    files = backlog(tmp_path, 12)
    room = Room(5)
    first = Discovered(tmp_path, MAX_FILE_AGE_MS, room=room)
    handed = first.scan()
    wait_past(files[-1][0] + MAX_FILE_AGE_MS * 1_000_000)
    room.splits = 3
    handed += first.scan()  # past the window's age: only the files it left hold the watermark
    cut = first.discovery.snapshot()
    first.close()

    second = Discovered(tmp_path, MAX_FILE_AGE_MS, room=Room(100))
    second.discovery.restore(cut, [s["splitId"] for s in handed[:2]])  # two reached a reader
    try:
        # The cut's hand-ons are the enumerator's (its pending splits and tracker, restored
        # with it); the files that waited on disk are new.
        assert sorted(names(second.scan())) == sorted(name for _, name in files[8:])
    finally:
        second.close()


def test_a_batch_scan_goes_again_until_every_file_was_handed_on(tmp_path):
    """Its input is the files there when it first looked: none that arrived since."""
    files = backlog(tmp_path, 7)
    kit = Discovered(tmp_path, MAX_FILE_AGE_MS, interval=None, room=Room(3))
    try:
        assert len(kit.scan()) == 3 and not kit.discovery.complete
        wait_past(kit.discovery.until + TICK)
        write(tmp_path / "arrived-later.csv")
        assert len(kit.scan()) == 3 and not kit.discovery.complete
        assert len(kit.scan()) == 1 and kit.discovery.complete
        assert kit.scan() == []
        assert sorted(names(kit.handed)) == sorted(name for _, name in files)
        assert kit.discovery.metrics()["throttledScans"] == 2
    finally:
        kit.close()


def test_a_file_changed_in_place_while_it_waits_is_handed_on_later(tmp_path):
    """Left for later, a file changed in place is not learnt: the next scan hands it on."""
    first = write(tmp_path / "a.csv")
    room = Room(1)
    kit = Discovered(tmp_path, room=room)  # the default age: a.csv stays known however slow
    try:
        assert names(kit.scan()) == ["a.csv"]
        wait_past(first + TICK)
        wait_past(write(tmp_path / "b.csv") + TICK)  # a.csv's new ctime comes after b.csv's
        inode = (tmp_path / "a.csv").stat().st_ino
        write(tmp_path / "a.csv", rows=2)  # rewritten in place: its ctime moves
        assert (tmp_path / "a.csv").stat().st_ino == inode
        assert names(kit.scan()) == ["b.csv"]  # the older arrival; a.csv waits
        assert names(kit.scan()) == ["a.csv"] and kit.discovery.metrics()["changed"] == 1
        assert kit.scan() == []
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


def test_a_batch_scan_that_timed_out_goes_again(tmp_path, monkeypatch):
    """A scan past its timeout is dropped unanswered: the next tick asks again, so a BATCH
    input still ends."""
    from engine.connectors import localfile_managed

    backlog(tmp_path, 3)
    first_call, release = threading.Event(), threading.Event()
    real = localfile_managed.scan

    def slow_once(*args):
        if not first_call.is_set():
            first_call.set()
            release.wait(30)  # the stuck scan
        return real(*args)

    monkeypatch.setattr(localfile_managed, "scan", slow_once)
    kit = Discovered(tmp_path, MAX_FILE_AGE_MS, interval=None, room=Room(100))
    try:
        kit.discovery.start()
        kit.loop.step()  # the tick asks for the scan, which hangs
        assert first_call.wait(10)
        kit.started = True
        kit.clock[0] += 30.0  # past the scan's timeout (the kit's scan moves it 1 s more)
        assert kit.scan() and kit.discovery.complete  # asked again, answered
        assert kit.loop.metrics["timeouts"] == 1
    finally:
        release.set()
        kit.close()


def test_a_batch_input_keeps_a_waiting_file_whose_ctime_moved(tmp_path):
    """A chmod (or a new link) moves a file's ctime, not its mtime: it was there all along."""
    files = backlog(tmp_path, 3)
    kit = Discovered(tmp_path, MAX_FILE_AGE_MS, interval=None, room=Room(1))
    try:
        assert len(kit.scan()) == 1
        wait_past(kit.discovery.until + TICK)
        os.chmod(tmp_path / files[-1][1], 0o600)
        assert (tmp_path / files[-1][1]).stat().st_ctime_ns >= kit.discovery.until
        while not kit.discovery.complete:
            assert kit.scan(), "a scan handed nothing on"
        assert sorted(names(kit.handed)) == sorted(name for _, name in files)
    finally:
        kit.close()


def test_a_restored_batch_discovery_keeps_its_input(tmp_path):
    """Its first look's bound is in its snapshot: a restore takes no file that came later."""
    files = backlog(tmp_path, 4)
    first = Discovered(tmp_path, MAX_FILE_AGE_MS, interval=None, room=Room(2))
    handed = first.scan()
    cut = first.discovery.snapshot()
    first.close()
    assert cut["until"] == first.discovery.until
    wait_past(cut["until"] + TICK)
    write(tmp_path / "arrived-later.csv")

    second = Discovered(tmp_path, MAX_FILE_AGE_MS, interval=None, room=Room(100))
    second.discovery.restore(cut, [s["splitId"] for s in handed])
    try:
        assert sorted(names(second.scan())) == sorted(name for _, name in files[2:])
        assert second.discovery.complete
    finally:
        second.close()


def test_a_batch_scan_answered_after_its_input_ended_hands_nothing_on(tmp_path, monkeypatch):
    """A tick's ask while a slow scan ran is run after it (coalesced): once the input ended,
    what it finds is not handed on (here a file copied in with its old times kept)."""
    from engine.connectors import localfile_managed

    files = backlog(tmp_path, 2)
    entered, release = threading.Event(), threading.Event()
    real = localfile_managed.scan

    def slow_first(*args):
        listing = real(*args)
        if not entered.is_set():
            entered.set()
            release.wait(30)  # listed, not answered yet
        return listing

    monkeypatch.setattr(localfile_managed, "scan", slow_first)
    kit = Discovered(tmp_path, MAX_FILE_AGE_MS, interval=None, room=Room(100))
    try:
        kit.discovery.start()
        kit.loop.step()  # the first scan, held once it listed
        assert entered.wait(10)
        kit.clock[0] += 1.0
        kit.loop.step()  # the next tick's ask waits behind it
        old = write(tmp_path / "copied-in.csv") - 10**12
        os.utime(tmp_path / "copied-in.csv", ns=(old, old))  # as cp -p leaves it
        release.set()
        kit.started = True
        assert sorted(names(kit.scan())) == sorted(name for _, name in files)
        assert kit.discovery.complete and kit.loop.metrics["coalesced"] >= 1
        assert len(kit.handed) == 2
    finally:
        release.set()
        kit.close()


def test_a_scan_keeps_the_oldest_files_of_its_limit_whatever_the_directory(tmp_path, monkeypatch):
    """It walks the directory holding at most about twice its limit: the oldest ``limit``, the
    oldest ctime of the rest and how many they were; without a limit, every file in name
    order."""
    from engine.connectors import localfile_scan
    from engine.connectors.localfile_scan import TRIM_SLACK, scan
    from tests.discoverykit import source_in

    files = backlog(tmp_path, 2 * 5 + TRIM_SLACK + 100)  # trimmed on the way
    config = source_in(tmp_path).config
    held: list[int] = []
    trim = localfile_scan.Cut.trim

    def measured(cut, found, final=False):
        held.append(len(found))
        return trim(cut, found, final)

    monkeypatch.setattr(localfile_scan.Cut, "trim", measured)
    listing = scan(tmp_path, config, None, {}, limit=5)
    assert max(held) == 2 * 5 + TRIM_SLACK + 1  # never the whole directory
    assert [f.name for f in listing.found] == [name for _, name in files[:5]]
    assert (listing.held, listing.left) == (files[5][0], len(files) - 5)
    stats = [(tmp_path / name).stat() for _, name in files]
    assert listing.newest == max(min(s.st_ctime_ns, s.st_mtime_ns) for s in stats)
    everything = scan(tmp_path, config, None, {})
    assert [f.name for f in everything.found] == sorted(name for _, name in files)
    assert (everything.held, everything.left) == (None, 0)
