"""LocalFile in the managed lane: a reader of file splits in bounded poll turns, and the
enumerator's discovery of new files on the coordinator's async workers.

Discovery lists the directory on the shared engine pool with an immutable input (the window of
files known, frozen when the scan is asked for, and its watermark); its result comes back to
the coordinator loop, fenced by epoch, and only there are new files remembered and handed on as
splits (ownership by split id). Scans repeat at a fixed delay (``file.discovery.interval``), one
at a time (COALESCE_ONE); without the option, a BATCH job's input is the files there at its
first scan.

What is remembered is bounded by the arrival rate, not by the files ever seen
(``engine.sourceruntime.arrivals``): a file's arrival stamp is its ctime, its identity its
inode, and the watermark trails the latest scan's start by ``file.discovery.max-file-age``. A
split is named by the file's path under the directory, its ctime and its inode
(``file:<path>@<ctime ns>:<inode>``): a new file under a name handed on before is a split of
its own (a new inode, or the inode of a deleted file reused under a newer ctime), and a restore
knows a held split's file from its id alone. A file changed in place after it was handed on is
therefore handed on again (at least once): files are immutable once they appear.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from engine.connectors.batches import limits as batch_limits
from engine.connectors.boundaries import resolve_file_path
from engine.connectors.fileformats import ARROW_FAILURES
from engine.connectors.localfile import LocalFileSource
from engine.connectors.localfile_backlog import FileBacklog
from engine.connectors.localfile_columns import OPTION as SCHEMA_CHANGES
from engine.connectors.localfile_columns import added_columns
from engine.connectors.localfile_scan import Cut, Found, Listing, scan
from engine.connectors.schema import Schema
from engine.sourceruntime.arrivals import ArrivalWindow, Verdict
from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.coordinator import CoordinatorEventLoop
from engine.sourceruntime.discovery import Discovery, KnownState
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.reader import PollContext, SplitOffsets
from engine.states import JobMode

CAPABILITY = LocalFileSource.managed_capability
#: What a record read as a row costs in a poll turn's byte budget (an estimate); a record of an
#: Arrow block costs the block's bytes shared out evenly.
ROW_BYTES = 64
#: ``file.discovery.max-file-age`` when the source does not set it (ms).
MAX_FILE_AGE_MS = 60_000
#: Files a reader keeps open at once: the least recently read one is closed beyond this and
#: opened again at its offset on its next turn (a storm of large files must not exhaust fds).
MAX_OPEN_FILES = 8
#: A BATCH job's scan goes again this often (s) until one left no file for later (or while
#: one failed or timed out).
RETRY_FULL = 1.0
#: What a scan hands on.
HANDED_ON = frozenset({Verdict.NEW, Verdict.REPLACED, Verdict.CHANGED})

log = logging.getLogger(__name__)


def split_for(found: Found) -> dict:
    split_id = f"file:{found.name}@{found.ctime}:{found.inode}"
    return {
        "splitId": split_id,
        "path": found.path,
        "relativePath": found.name,
        "bytes": found.size,
    }


def arrival_of(split_id: str) -> tuple[str, int, int | None] | None:
    """A file split's (path under the directory, ctime, inode) from its id; an id of the earlier
    form (``file:<path>``) has no ctime (0) nor inode; None: not a file split."""
    if not split_id.startswith("file:"):
        return None
    name, _, stamp = split_id[len("file:") :].rpartition("@")
    ctime, _, inode = stamp.partition(":")
    if name and ctime.isdigit() and inode.isdigit():
        return name, int(ctime), int(inode)
    return split_id[len("file:") :], 0, None


class FileDiscovery(Discovery):
    """New files in the source's directory, by scans on the shared pool: at a fixed delay of
    ``interval`` seconds (``file.discovery.interval``); when it is None (a BATCH job), every
    second until a scan handed on every file there at its first scan, and then it is complete
    (and scans no more). Remembers the files that arrived within
    ``file.discovery.max-file-age`` of its latest scan.

    ``room``: how many more splits the enumerator takes now (its pending splits' bound less
    those it holds). A scan hands on at most that many new files, the oldest first, and leaves
    the rest on disk for a later scan (the watermark stays below them): a backlog waits in the
    directory, not in the enumerator's memory and checkpoints."""

    def __init__(
        self,
        source: LocalFileSource,
        loop: CoordinatorEventLoop,
        interval: float | None,
        on_new: Callable[[list[dict]], None],
        room: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(loop, on_new)
        self.source, self.interval, self.room = source, interval, room
        self.root = resolve_file_path(source.config["path"])
        max_age_ms = source.config.get("file.discovery.max-file-age") or MAX_FILE_AGE_MS
        self.window = ArrivalWindow(max_age_ms * 1_000_000)
        self.failures = self.scans = self.older = self.replaced = self.changed = 0
        self.held_back = 0  # new files the latest scan left for a later one
        self.throttled = 0  # scans that left new files for a later one
        self.until: int | None = None  # a BATCH job's: its input arrived before it (ns)

    def _room(self) -> int | None:
        return None if self.room is None else max(self.room(), 0)

    def start(self) -> None:
        self.loop.schedule_in_coordinator_thread("discovery-tick", 0, self._tick)

    def _tick(self) -> None:
        """A scan, unless the enumerator is full; the next tick follows at the interval (a
        BATCH job's until its scan left nothing: a scan that failed or timed out goes again)."""
        if self.complete:
            return
        self.loop.schedule_in_coordinator_thread("discovery-tick", self._every, self._tick)
        if self._room() == 0:  # full: nothing a scan found could be handed on
            return
        # The scan's input, immutable, taken on the loop.
        args = (dict(self.source.config), self.window.watermark, self.window.frozen())
        limit, until = self._room(), self.until
        self.loop.call_async("discovery", lambda: scan(self.root, *args, limit, until), self._found)

    @property
    def _every(self) -> float:
        return self.interval if self.interval is not None else RETRY_FULL

    def _found(self, listing: Listing | None, error: BaseException | None) -> None:
        if error is not None:
            self.failures += 1  # the next tick scans again
            return
        if self.complete:
            return  # a BATCH job's scan asked before its input was complete
        batch = self.interval is None
        if batch and self.until is None:
            # Its input: the files there when it first looked, all of that listing's (a file
            # server's clock may run ahead of ours).
            self.until = max(listing.started, (listing.newest or 0) + 1)
        arrivals, older = self._arrivals(listing)
        cut = Cut(self._room())  # the oldest go now, the rest wait
        arrivals = cut.trim(arrivals, final=True)
        held = min((h for h in (listing.held, cut.held) if h is not None), default=None)
        new = []
        for found in arrivals:
            verdict = self.window.judge(found.name, found.ctime, found.inode)
            split = split_for(found)
            self.window.remember(found.name, split["splitId"], found.ctime, found.inode)
            new.append(split)
            self.replaced += verdict == Verdict.REPLACED
            self.changed += verdict == Verdict.CHANGED
        self.window.advance(listing.started, held)
        self.scans, self.older = self.scans + 1, older
        self.held_back = listing.left + cut.left
        self.throttled += held is not None
        # A BATCH input is complete once a scan left nothing for later (before the hand-on:
        # the enumerator may end the input there).
        self.complete = batch and held is None
        if new:
            self.on_new(new)

    def _arrivals(self, listing: Listing) -> tuple[list[Found], int]:
        """The files of ``listing`` to hand on, judged against the window as it is now (a
        coalesced scan was asked with an older one) but not learnt yet, and the count of files
        below the watermark. A BATCH job leaves out what arrived after its first look (both
        its ctime and mtime later)."""
        arrivals, older = [], listing.older
        for found in listing.found:
            if self.until is not None and found.arrived >= self.until:
                continue
            verdict = self.window.peek(found.name, found.ctime, found.inode)
            if verdict in HANDED_ON:
                arrivals.append(found)
            else:
                self.window.judge(found.name, found.ctime, found.inode)
                older += verdict == Verdict.OLDER
        return arrivals, older

    def snapshot(self) -> dict:
        window = self.window.to_json()
        return window if self.until is None else {**window, "until": self.until}

    def restore(self, state: KnownState, handed_on: Iterable[str] = ()) -> None:
        """The cut's window (a list: the earlier form, split ids), and the splits the readers
        hold as of that checkpoint, known again from their ids."""
        margin = self.window.margin
        if isinstance(state, dict):
            self.window = ArrivalWindow.from_json(state, margin)
            self.until = state.get("until") if self.interval is None else None
        else:
            self.window = ArrivalWindow(margin)
            handed_on = [*(state or ()), *handed_on]
        for split_id in handed_on:
            arrival = arrival_of(split_id)
            if arrival is not None:
                self.window.remember(arrival[0], split_id, arrival[1], arrival[2])

    def metrics(self) -> dict:
        """Counts for the enumerator's report: files known (the window), scans and failed ones,
        files the latest scan left below the watermark, files replaced under a known name,
        known inodes under a newer ctime (changed in place, or a reused inode), handed on
        again, new files the latest scan left on disk for a later one (the enumerator's
        pending splits were at their bound), and the scans that left some."""
        watermark = self.window.watermark
        return {
            "known": len(self.window.entries),
            "scans": self.scans,
            "failures": self.failures,
            "older": self.older,
            "replaced": self.replaced,
            "changed": self.changed,
            "compacted": self.window.compacted,
            "heldBack": self.held_back,
            "throttledScans": self.throttled,
            "watermarkLagMs": None if watermark is None else (time.time_ns() - watermark) // 10**6,
        }


@dataclass(slots=True)
class OpenFile:
    """A file being read: its reader, positioned after ``block``, the records read ahead and
    not all emitted yet (a record batch, or a list of rows) from offset ``first`` to ``end``,
    and what each of them costs in a turn's byte budget."""

    blocks: Generator[tuple[pa.RecordBatch | list[tuple], int], None, None]
    block: pa.RecordBatch | list[tuple] | None = None
    first: int = 0
    end: int = 0
    size: int = ROW_BYTES


class ManagedLocalFileReader(SplitOffsets):
    """Its state is its unfinished files: a file read to its end leaves the splits and offsets
    at once, so the state is bounded by the files being read, not by those ever read. Nothing
    reads a left file again: a repeated assignment command is a duplicate to the mailbox's
    applied watermarks, and the enumerator never assigns a split again under a new command once
    a reader's metadata proves it has it (a restore keeps it the reader's)."""

    #: 2: no ``done`` list (finished files leave the state). Version 1 state, which kept them
    #: with their ``done`` ids, is read by leaving those out.
    STATE_VERSION = 2

    def __init__(self, source: LocalFileSource, mode: str = JobMode.STREAMING) -> None:
        super().__init__()
        self.source, self.mode = source, mode
        #: Open files, by split id, least recently read first, at most ``MAX_OPEN_FILES``
        #: (derived, never checkpointed: a restore opens them again).
        self._reading: OrderedDict[str, OpenFile] = OrderedDict()
        #: Splits whose file was replaced under its name before it was opened (or reopened).
        self.replaced_before_read = 0
        self.reopened = 0  # files closed past MAX_OPEN_FILES and opened again
        #: What it has left to read, told its enumerator (``source_event``), never checkpointed.
        self.backlog = FileBacklog()
        #: ``schema-changes.enabled``: a file with columns the schema lacks asks for a schema
        #: change (``schema_request``, read by the event loop) before any of its records.
        self.evolving = bool(source.config.get(SCHEMA_CHANGES))
        self.schema_request: list | None = None

    def restore(self, state: dict) -> None:
        super().restore(state)
        for split_id in state.get("done", ()):  # version 1
            self.splits.pop(split_id, None)
            self.offsets.pop(split_id, None)
        while self._reading:
            self._reading.popitem()[1].blocks.close()

    def metrics(self) -> dict:
        """Counts for the reader's report (never ids or paths)."""
        return {
            "openFiles": len(self._reading),
            "reopened": self.reopened,
            "replacedBeforeRead": self.replaced_before_read,
            "splitsAdded": self.backlog.added,
            "backlogFiles": self.backlog.last["files"],
            "backlogBytes": self.backlog.last["bytes"],
        }

    def add_splits(self, splits: list[dict]) -> None:
        super().add_splits(splits)
        self.backlog.added += len(splits)

    def source_event(self) -> dict:
        """Its backlog, for its enumerator's choice of a reader for new files: an ephemeral
        SOURCE_EVENT sent at most every ``source-events.interval`` (engine.member
        .enumerator_link); lost, the next one says the same."""
        return self.backlog.event(self.splits, self.offsets)

    def _finished(self, split_id: str) -> None:
        """Read to its end: it leaves the state (its rows were emitted in earlier turns)."""
        self.backlog.finished(split_id, self.offsets.get(split_id, 0))
        self.splits.pop(split_id, None)
        self.offsets.pop(split_id, None)
        reading = self._reading.pop(split_id, None)
        if reading is not None:
            reading.blocks.close()

    def _open(self, split_id: str, limits: PollLimits) -> OpenFile:
        """The split's file opened at its offset, the least recently read ones closed first so
        that at most ``MAX_OPEN_FILES`` are open (each is opened again at its offset)."""
        while len(self._reading) >= MAX_OPEN_FILES:
            _, closed = self._reading.popitem(last=False)
            closed.blocks.close()
            self.reopened += 1
        reading = self._reading[split_id] = OpenFile(self._blocks(split_id, limits))
        return reading

    def poll(self, context: PollContext) -> PollStatus:
        """Records of the current file, out of the block read ahead from it (the Arrow batch
        LocalFile reads, as many records as a Lane B batch; rows, a turn's, where its format
        or values have no batches) as a run of turns cut from it, the file's offset advanced
        by what was emitted before the call returns. Once its block is out the next file's
        turn comes, in the same step if turns are left (a step's blocks go to the sinks as one
        batch, ``step_batches``): one block is held at a time. Woken (``wakeup()``), it
        returns before opening another file."""
        order = sorted(self.offsets)
        for turn in range(len(order)):
            if turn and context.wake.woken:
                return PollStatus.MORE_AVAILABLE
            split_id = order[(self.cursor + turn) % len(order)]
            offset = self.offsets[split_id]
            reading = self._reading.get(split_id)
            if reading is None and offset == 0 and self.evolving and self._asks(split_id):
                context.end_step()  # nothing of it emitted: the loop starts the change
                return PollStatus.MORE_AVAILABLE
            if reading is None:  # opened at its offset
                reading = self._open(split_id, context.limits)
            else:
                self._reading.move_to_end(split_id)
            if reading.block is None:
                step = next(reading.blocks, None)
                if step is None:
                    self._finished(split_id)
                    continue
                block, end = step
                reading.block, reading.first, reading.end = block, offset, end
                arrow = isinstance(block, pa.RecordBatch) and block.num_rows
                reading.size = max(-(-block.nbytes // block.num_rows), 1) if arrow else ROW_BYTES
            first, end = reading.first, reading.end
            offset += context.emit_turns(reading.block, offset - first, end - first, reading.size)
            self.offsets[split_id] = offset  # advanced with the records, before it returns
            if offset == end:  # the block is out: the next file's turn
                reading.block = None
                self.cursor = (order.index(split_id) + 1) % len(order)
            return PollStatus.MORE_AVAILABLE
        if self.no_more_splits and self.mode == JobMode.BATCH:
            return PollStatus.END_OF_INPUT
        return PollStatus.NOTHING_AVAILABLE

    def _asks(self, split_id: str) -> bool:
        """Whether the split's file has columns the schema in effect lacks: then the new
        schema (those added at its end) is the loop's ``schema_request``."""
        path = resolve_file_path(self.splits[split_id]["path"])
        schema = self.source.output_schema()
        try:
            added = added_columns(
                path, self.source.config, schema.fields, self.source.partition_of(path)
            )
        except OSError as exc:  # read as before: its read reports the problem
            log.warning("LocalFile reader: cannot read %s's columns: %s", path.name, exc)
            return False
        except ValueError as exc:  # the reader fails, naming the file
            raise ValueError(f"{path.name}: no schema change from its columns: {exc}") from exc
        if not added:
            return False
        self.schema_request = Schema((*schema.fields, *added)).to_json()
        return True

    def schema_changed(self, schema: list) -> None:
        """The schema change completed (or a restore's schema): files are read with it."""
        self.source.evolved = Schema.from_json(schema)

    def _blocks(self, split_id: str, limits: PollLimits) -> Generator[tuple[object, int]]:
        """The file's records from its offset, each block with the offset after it: the Arrow
        batches LocalFile reads (``LocalFileSource.batches``), as many records each as a Lane B
        batch; where its format, options or values have none, rows from where the batches
        stopped, as many at a time as a turn holds (rows cost per row to convert). None when
        the file under the split's path is no longer the one its id names."""
        split, done = self.splits[split_id], self.offsets[split_id]
        path = resolve_file_path(split["path"])
        if self._replaced(split_id, path):
            return
        try:
            for batch in self.source.batches(path, done, batch_limits()[0]):
                done += batch.num_rows
                yield batch, done
        except ARROW_FAILURES:
            per_turn = max(min(limits.max_records, limits.max_bytes // ROW_BYTES), 1)
            yield from self.source.read_rows(split, done, self.mode, per_turn)

    def _replaced(self, split_id: str, path: Path) -> bool:
        """Whether the file the split's id names (inode and ctime) is gone from its path: a
        file renamed in under the same name since is another split (the discovery hands it on
        by its own id), so this one ends with nothing more read. Ids of the earlier form name
        no inode: their file is read whatever it is now."""
        arrival = arrival_of(split_id)
        if arrival is None or arrival[2] is None:
            return False
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return False  # read as before: the open fails the task
        if (stat.st_ino, stat.st_ctime_ns) == (arrival[2], arrival[1]):
            return False
        self.replaced_before_read += 1
        log.warning(
            "LocalFile reader: %s was replaced before it was read to its end; its split ends "
            "here, the new file is read as a split of its own",
            arrival[0],
        )
        return True
