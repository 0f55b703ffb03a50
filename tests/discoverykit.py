"""A LocalFile discovery driven in process: its scans run on a real shared pool, its coordinator
loop is stepped on the test's thread under a clock the test moves (so a scan happens when the
test asks for one, never by timing), and the files are real, with the ctimes the kernel gave
them."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from engine.connectors.localfile import LocalFileSource
from engine.connectors.localfile_managed import FileDiscovery
from engine.jobs.planner import plan_job
from engine.sourceruntime.coordinator import CoordinatorEventLoop, SharedWorkerPool

INTERVAL = 1.0


def source_in(directory: Path, max_file_age_ms: int | None = None) -> LocalFileSource:
    """A planned STREAMING source (its directory may start empty)."""
    age = f"file.discovery.max-file-age = {max_file_age_ms}" if max_file_age_ms else ""
    plan = plan_job(
        "env { job.mode = STREAMING }\n"
        f'source {{ LocalFile {{ path = "{directory}", file.discovery.interval = 1000, {age}\n'
        "  schema { fields { id = int } } } }\nsink { Blackhole {} }"
    )
    node = plan.pipelines[0].source
    return LocalFileSource(node.config, node.path)


def write(path: Path, rows: int = 1) -> int:
    """A file of ``rows`` rows; returns its ctime (ns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{i}\n" for i in range(rows)))
    return path.stat().st_ctime_ns


def wait_past(ns: int, deadline: float = 10.0) -> None:
    """Until the wall clock (the one ctimes come from) is past ``ns``."""
    give_up = time.monotonic() + deadline
    while time.time_ns() <= ns:
        assert time.monotonic() < give_up, "the clock never passed the mark"
        time.sleep(0.001)


class Discovered:
    """One FileDiscovery and the splits it handed on, scan by scan."""

    def __init__(
        self,
        directory: Path,
        max_file_age_ms: int | None = None,
        pool: SharedWorkerPool = None,
        *,
        interval: float | None = INTERVAL,
        room=None,
    ) -> None:
        self.pool = pool or SharedWorkerPool(2)
        self.clock = [0.0]
        self.woken = threading.Event()
        self.loop = CoordinatorEventLoop(
            self.pool, clock=lambda: self.clock[0], wakeup=self.woken.set
        )
        self.handed: list[dict] = []
        self.discovery = FileDiscovery(
            source_in(directory, max_file_age_ms),
            self.loop,
            interval,
            self.handed.extend,
            room,
        )
        self.started = False

    def scan(self) -> list[dict]:
        """One scan, asked now and applied on the loop: the splits it handed on."""
        before = len(self.handed)
        if self.started:
            self.clock[0] += INTERVAL
        else:
            self.discovery.start()
            self.started = True
        for _ in range(1000):
            self.woken.clear()
            while self.loop.step():  # the tick asks for the scan; its result comes back here
                pass
            if not self.loop.in_flight:
                return self.handed[before:]
            assert self.woken.wait(10), "the scan never came back"
        raise AssertionError("the scan never settled")

    def close(self) -> None:
        self.pool.executor.shutdown()


def rename_in(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(source, target)
