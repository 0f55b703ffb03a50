"""LocalFile in the managed lane: a reader of file splits in bounded poll turns, and the
enumerator's discovery of new files on the coordinator's async workers.

Discovery lists the directory on the shared engine pool with an immutable input (the files
already known, frozen when the scan is asked for); its result comes back to the coordinator
loop, fenced by epoch, and only there are new files added and handed on as splits, each named
by its path under the source directory (ownership by split id). Scans repeat at a fixed delay
(``file.discovery.interval``), one at a time (COALESCE_ONE); without the option there is one
scan, and a BATCH job's input ends with the files it found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from engine.connectors.boundaries import resolve_file_path
from engine.connectors.localfile import LocalFileSource, _files
from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.coordinator import CoordinatorEventLoop
from engine.sourceruntime.discovery import Discovery
from engine.sourceruntime.reader import PollContext, SplitOffsets
from engine.states import JobMode

CAPABILITY = LocalFileSource.managed_capability
ROW_BYTES = 64


def split_for(root: Path, path: Path) -> dict:
    relative = path.relative_to(root).as_posix()
    return {"splitId": f"file:{relative}", "path": str(path), "relativePath": relative}


def scan(root: Path, config: dict, known: frozenset[str]) -> list[dict]:
    """The files under ``root`` that are not in ``known`` (split ids), as splits, in order.
    Runs on a worker of the shared pool: it reads only its arguments."""
    return [s for p in _files(root, config) if (s := split_for(root, p))["splitId"] not in known]


class FileDiscovery(Discovery):
    """New files in the source's directory, by scans on the shared pool: at a fixed delay of
    ``interval`` seconds (``file.discovery.interval``), or once when it is None (then the
    discovery is complete after its first scan)."""

    def __init__(
        self,
        source: LocalFileSource,
        loop: CoordinatorEventLoop,
        interval: float | None,
        on_new: Callable[[list[dict]], None],
    ) -> None:
        super().__init__(loop, on_new)
        self.source, self.interval = source, interval
        self.root = resolve_file_path(source.config["path"])
        self.failures = 0

    def start(self) -> None:
        self.loop.schedule_in_coordinator_thread("discovery-tick", 0, self._tick)

    def _tick(self) -> None:
        known = frozenset(self.known)  # the scan's input: immutable, taken on the loop
        config = dict(self.source.config)
        self.loop.call_async("discovery", lambda: scan(self.root, config, known), self._found)
        if self.interval is not None:
            self.loop.schedule_in_coordinator_thread("discovery-tick", self.interval, self._tick)

    def _found(self, splits: list[dict] | None, error: BaseException | None) -> None:
        if error is not None:
            self.failures += 1  # the next tick scans again
            if self.interval is None:
                self.loop.schedule_in_coordinator_thread("discovery-tick", 1.0, self._tick)
            return
        if self.interval is None:
            self.complete = True  # before the hand-on: the enumerator may end the input there
        self.hand_on(splits or [])


class ManagedLocalFileReader(SplitOffsets):
    def __init__(self, source: LocalFileSource, mode: str = JobMode.STREAMING) -> None:
        super().__init__()
        self.source, self.mode = source, mode
        self.done: set[str] = set()  # files read to their end
        #: Open readers, positioned at their offset, with the batch size they yield.
        self._reading: dict[str, tuple[int, Iterator]] = {}

    def snapshot(self) -> dict:
        return {**super().snapshot(), "done": sorted(self.done)}

    def restore(self, state: dict) -> None:
        super().restore(state)
        self.done = set(state.get("done", []))
        self._reading.clear()

    def poll(self, context: PollContext) -> PollStatus:
        """One batch of at most the turn's records from the next unfinished file, its offset
        advanced with it."""
        order = [s for s in sorted(self.offsets) if s not in self.done]
        for turn in range(len(order)):
            split_id = order[(self.cursor + turn) % len(order)]
            allowed = min(context.remaining_records, context.limits.max_bytes // ROW_BYTES)
            allowed = max(1, allowed)
            size, reading = self._reading.get(split_id, (0, None))
            if reading is None or size > allowed:  # (re)opened at the offset, batches fitting
                reading = self.source.read_rows(
                    self.splits[split_id], self.offsets[split_id], self.mode, allowed
                )
                self._reading[split_id] = (allowed, reading)
            step = next(reading, None)
            if step is None:
                self.done.add(split_id)
                self._reading.pop(split_id, None)
                continue
            rows, offset = step
            for row in rows:
                context.emit(row, ROW_BYTES)
            self.offsets[split_id] = offset  # advanced with the rows, in the same turn
            self.cursor = (self.cursor + turn + 1) % max(len(order), 1)
            return PollStatus.MORE_AVAILABLE
        if self.no_more_splits and self.mode == JobMode.BATCH:
            return PollStatus.END_OF_INPUT
        return PollStatus.NOTHING_AVAILABLE
