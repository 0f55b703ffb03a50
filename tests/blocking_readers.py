"""Managed reader doubles whose poll call waits, for the watchdog's and the conformance suite's
tests: one that waits for its ``wakeup()`` (what the runtime allows of a reader that must wait)
and one that ignores it (stuck until the test releases it), and a reader event loop run on a
thread of its own as a task group's thread runs it."""

from __future__ import annotations

import threading
import time

import pytest

from engine.connectors.fake import FakeSource
from engine.connectors.managed import RUNTIMES
from engine.sourceruntime.choices import CommandKind, PollStatus
from engine.sourceruntime.lifecycle import Life
from engine.sourceruntime.limits import MailboxLimits, PollLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from engine.sourceruntime.reader import PollContext, ReaderEventLoop, SplitOffsets
from tests.source_conformance import admit

ROWS = 3  # each split's


class WaitingReader(SplitOffsets):
    """A poll call with splits assigned waits until ``wakeup()`` (or ``released``), then reads
    every split to its end: a reader whose wait is on something its wakeup sets."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()  # a poll call is waiting
        self.released = threading.Event()  # the test's way out of the wait
        self._woken = threading.Event()
        self.wakeups = 0
        self.on_enter = lambda: None  # run as a call starts, before it forgets older wakeups

    def release(self) -> None:
        self.released.set()
        self._woken.set()

    def wakeup(self) -> None:
        super().wakeup()
        self.wakeups += 1
        self._woken.set()

    def wait(self) -> None:
        self._woken.wait()

    def poll(self, context: PollContext) -> PollStatus:
        if not self.splits:
            return PollStatus.NOTHING_AVAILABLE
        self.on_enter()
        self._woken.clear()
        self.entered.set()
        self.wait()
        self.entered.clear()
        for split_id in sorted(self.offsets):
            for n in range(self.offsets[split_id], ROWS):
                context.emit((int(split_id[1:]) * 1000 + n,), 8)  # (id,): a bigint column
            self.offsets[split_id] = ROWS
        return PollStatus.END_OF_INPUT if self.no_more_splits else PollStatus.NOTHING_AVAILABLE


class StuckReader(WaitingReader):
    """Non-compliant: its poll call waits for ``released`` alone, whatever wakes it."""

    def wait(self) -> None:
        self.released.wait()


def splits(n: int = 1) -> list[dict]:
    return [{"splitId": f"s{i}"} for i in range(n)]


class LoopThread:
    """A reader event loop over ``reader`` stepping on a thread of its own until it closes."""

    def __init__(self, reader, limits: PollLimits, clock=time.monotonic) -> None:
        self.woken = threading.Event()
        self.box = ReaderMailbox(
            1, "1/1", 1, MailboxLimits(), WorkerBudget(10**9), wakeup=self.woken.set, clock=clock
        )
        self.out: list = []
        self.loop = ReaderEventLoop(
            self.box, reader, limits, self.out.extend, lambda s: None, "digest", clock=clock
        )
        self.loop.start()
        self.thread = threading.Thread(target=self._run, name="reader-loop", daemon=True)

    def _run(self) -> None:
        while self.loop.life.state != Life.CLOSED:
            self.woken.clear()
            if not self.loop.step():
                self.woken.wait(0.05)

    def start(self, assigned: list[dict]) -> LoopThread:
        admit(self.box, CommandKind.ASSIGN_SPLITS, {"splits": assigned})
        admit(self.box, CommandKind.NO_MORE_SPLITS)
        self.thread.start()
        return self

    def closed(self, within: float = 10.0) -> bool:
        self.thread.join(within)
        return not self.thread.is_alive()


#: A streaming Lane A job of one FakeSource reader (``stuck`` makes its reader a StuckReader).
STUCK_JOB = """
env { job.mode = STREAMING, parallelism = 1 }
source { FakeSource { schema { fields { id = bigint } } } }
sink { Blackhole { } }
"""


@pytest.fixture
def stuck(settings, monkeypatch):
    """FakeSource in Lane A, its managed reader one that is stuck in its first poll call with
    splits (released when the test ends); a short cancellation timeout."""
    settings.ENGINE = {
        **settings.ENGINE,
        "source-runtime.managed-connectors": ["FakeSource"],
        "source-runtime.poll.hard-duration": 3600.0,
        "source-runtime.poll.cancellation-timeout": 0.3,
    }
    reader = StuckReader()
    reader.add_splits(splits())
    monkeypatch.setitem(
        RUNTIMES, FakeSource.name, (lambda source, mode: reader, RUNTIMES[FakeSource.name][1])
    )
    yield reader
    reader.release()
