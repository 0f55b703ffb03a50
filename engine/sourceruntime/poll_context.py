"""What the poll turns of one step may still emit, and what they emitted.

A reader emits records as rows (tuples: ``emit``, ``emit_many``) or as slices of what it holds,
a list of rows or an Arrow record batch (``emit_slice``, and ``emit_turns`` for runs of whole
turns). A step's output (``settle``) is a list of parts in emitted order, each a
``pyarrow.RecordBatch`` or a list of rows: slices of one batch emitted end to end are one part
(the batch itself when they cover it, else one zero-copy ``batch.slice``), and rows emitted one
after another are one list, so the task group converts them to a batch once a step. Nothing is
copied on the way: batches are never concatenated row by row, and a list the reader lent is
handed over as it is (copied once, before anything is added to it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.mailbox import ReaderMailbox
from engine.sourceruntime.watchdog import PollWatch, Wakeup

#: Poll turns one step may run back to back while nothing else is queued: at the default
#: ``poll.max-records`` (64), a step hands over as many records as a Lane B batch holds
#: (``engine.dataplane.batch-rows``, 16,384), so the sinks see batches of Lane B's size.
TURNS_PER_STEP = 256


def rows_of(parts: list) -> list[tuple]:
    """A step's output (``settle``) as rows, a batch's converted column by column into Arrow's
    Python values: for tests and diagnostics (the data plane hands the batches on as they are)."""
    rows: list[tuple] = []
    for part in parts:
        if isinstance(part, list):
            rows.extend(part)
        else:
            rows.extend(zip(*(column.to_pylist() for column in part.columns), strict=True))
    return rows


class PollContext:
    """What one poll turn may still do; ``emit`` hands a record over with its size.

    The turns of one step share their output (``out``, complete after ``settle()``): a turn's
    budget counts from where it began, so handing a turn's records over costs nothing, and
    slices of one list or batch emitted end to end (``emit_slice``) become one part when
    settled: a whole list or batch so emitted is handed over as it is (a lent list is copied
    before anything is added to it: the context never changes a list the reader lent it).
    """

    __slots__ = (
        "_box",
        "_lent",
        "_run",
        "_run_start",
        "_run_stop",
        "bytes",
        "clock",
        "deadline",
        "ended",
        "first",
        "length",
        "limits",
        "out",
        "started",
        "step_ended",
        "turns_left",
        "wake",
        "watch",
    )

    def __init__(
        self,
        limits: PollLimits,
        clock: Callable[[], float],
        started: float,
        box: ReaderMailbox | None = None,
        wake: Wakeup | None = None,
        watch: PollWatch | None = None,
    ) -> None:
        self.limits, self.clock = limits, clock
        #: The watchdog's view of the poll call in progress: each turn's start is written to
        #: it (an attribute write), so the hard budget is judged per turn, never per call.
        self.watch = watch
        #: Set when the poll call in progress is woken: it ends at its next turn or record
        #: boundary (``next_turn``, ``emit_turns`` and ``should_yield`` read it).
        self.wake = wake if wake is not None else Wakeup()
        #: The parts settled so far: record batches and lists of rows, in emitted order.
        self.out: list[Any] = []
        #: Further turns this poll call may start (``next_turn``), and how many it ended so.
        self.turns_left, self.ended = 0, 0
        #: The mailbox the event loop checks between turns (None: one turn per call).
        self._box = box
        self.length = 0  # records emitted this step, the pending slice included
        #: A slice emitted but not settled yet: _run[_run_start:_run_stop], a list or a batch.
        self._run: Any = None
        self._run_start = self._run_stop = 0
        self._lent = False  # whether the last part is a list the reader lent (never changed)
        self.step_ended = False  # the reader reached a natural end of a batch (end_step)
        self.begin(started)

    def begin(self, started: float) -> None:
        """A new turn starts now, its records after those already emitted."""
        self.started, self.deadline = started, started + self.limits.soft
        if self.watch is not None:
            self.watch.started = started
        self.first, self.bytes = self.length, 0

    def settle(self) -> list:
        """Every record emitted so far, in order, as the parts in ``out``."""
        run = self._run
        if run is not None:
            self._run = None
            start, stop = self._run_start, self._run_stop
            if stop <= start:
                pass
            elif not isinstance(run, list):  # a batch: itself, or one zero-copy slice of it
                whole = start == 0 and stop == run.num_rows
                self.out.append(run if whole else run.slice(start, stop - start))
            elif (
                start == 0
                and stop == len(run)
                and not (self.out and isinstance(self.out[-1], list))
            ):
                self.out.append(run)  # the whole list, slice by slice: no copy
                self._lent = True
            else:
                self._rows().extend(run[start:stop])
        return self.out

    def _rows(self) -> list:
        """The list of rows that ends ``out``, to add to: a list the reader lent is copied
        first; after a batch (or at the start) a new one."""
        out = self.out
        if out and isinstance(out[-1], list):
            if self._lent:
                out[-1], self._lent = list(out[-1]), False
            return out[-1]
        rows: list = []
        out.append(rows)
        self._lent = False
        return rows

    @property
    def records(self) -> list[tuple]:
        """This turn's records so far, as rows (``rows_of``: for tests and diagnostics)."""
        return rows_of(self.settle())[self.first :]

    @property
    def count(self) -> int:
        return self.length - self.first

    def emit(self, record: tuple, size: int = 0) -> None:
        if self._run is not None:
            self.settle()
        self._rows().append(record)
        self.length += 1
        self.bytes += size

    def emit_many(self, records: list[tuple], size_each: int = 0) -> None:
        """A block of rows at once (what a row-minded reader produces)."""
        if self._run is not None:
            self.settle()
        self._rows().extend(records)
        self.length += len(records)
        self.bytes += size_each * len(records)

    def emit_slice(
        self, rows: list | pa.RecordBatch, start: int, stop: int, size_each: int = 0
    ) -> None:
        """``rows[start:stop]``, of a list of rows or a record batch the reader no longer
        changes: a slice that goes on where the last one ended, in the same list or batch,
        extends it instead of being cut (a batch's slices end to end are one part)."""
        if self._run is not rows or self._run_stop != start:
            if self._run is not None:
                self.settle()
            self._run, self._run_start = rows, start
        self._run_stop = stop
        self.length += stop - start
        self.bytes += size_each * (stop - start)

    def emit_turns(
        self, rows: list | pa.RecordBatch, start: int, stop: int, size_each: int = 0
    ) -> int:
        """``rows[start:stop]`` (a list of rows or a record batch the reader no longer changes)
        as back-to-back turns: the first fills what this turn's budgets still allow, each
        further one begins only where ``next_turn`` would begin one. Returns how many records
        were emitted, for the reader to advance its state by as many before it returns (nothing
        runs between these turns but the loop's checks). The last turn stays open when the
        records end inside it."""
        limits = self.limits
        per_turn = limits.max_records
        if size_each:
            per_turn = min(per_turn, limits.max_bytes // size_each)
            room = min(per_turn - self.count, (limits.max_bytes - self.bytes) // size_each)
        else:
            room = per_turn - self.count
        per_turn = max(per_turn, 1)  # a turn always makes progress
        if room <= 0:
            if self.count:
                return 0  # this turn's budget is spent
            room = 1  # a record larger than the byte budget still goes, alone
        taken = min(start + room, stop)
        self.emit_slice(rows, start, taken, size_each)
        if taken == stop or not self.next_turn():
            return taken - start
        # Further turns, each filled at once (turns are cut from one slice). Between two of
        # them only the mailbox is checked, inline (this is the hot path): no reader code runs
        # between them, so none can overrun its soft duration (next_turn has just read the
        # clock for the turn that did run reader code); the last one's start is read once.
        box, wake = self._box, self.wake
        terminal = box.terminal
        turns = min(-(-(stop - taken) // per_turn), self.turns_left + 1)
        # Turn k gets its records (a whole turn's, or the rest): k is where a check found work.
        for k in range(1, turns):  # noqa: B007 - read after the loop
            if box.commands or terminal.kind is not None or wake.woken:
                break
        else:
            k = turns
        last = min(per_turn, stop - taken - (k - 1) * per_turn)
        filled = (k - 1) * per_turn + last
        self.emit_slice(rows, taken, taken + filled)
        self.first, self.bytes = self.length - last, last * size_each
        if k > 1:
            self.started = self.clock()
            self.deadline = self.started + limits.soft
            if self.watch is not None:
                self.watch.started = self.started
        self.turns_left -= k - 1
        self.ended += k - 1
        return taken + filled - start

    @property
    def remaining_records(self) -> int:
        return max(self.limits.max_records - self.length + self.first, 0)

    def next_turn(self) -> bool:
        """The turn so far is complete (its records emitted, their state advanced): True if
        another turn has begun, in this same call, because the event loop would have started
        one now: turns are left in this step, the turn kept within its soft duration, and
        nothing else (terminal signal, ordered control, completion) is queued. This is the
        check the loop makes between turns, made here, so a reader with cheap turns saves a
        call per turn; False: return from ``poll`` (with MORE_AVAILABLE) without emitting."""
        if self.turns_left <= 0 or self.wake.woken or self._box is None or self._box.has_work():
            return False
        now = self.clock()
        if now - self.started > self.limits.soft:
            return False  # the loop accounts for the overrun once poll returns
        self.turns_left -= 1
        self.ended += 1
        self.begin(now)
        return True

    def end_step(self) -> None:
        """The records so far end a batch of the reader's (a block it built is all out): the
        loop hands them over now rather than going on into another turn in this step, so a
        step's records are that batch, handed over uncut, rather than parts of two. The
        reader returns from ``poll`` right after (MORE_AVAILABLE if it has more)."""
        self.step_ended, self.turns_left = True, 0

    def should_yield(self) -> bool:
        return (
            self.wake.woken
            or self.length - self.first >= self.limits.max_records
            or self.bytes >= self.limits.max_bytes
            or self.clock() >= self.deadline
        )
