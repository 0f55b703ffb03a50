"""A reader that goes straight on from one poll turn to the next inside one ``poll`` call
(``PollContext.next_turn``, ``emit_turns``) keeps every turn's budgets and the loop's checks
between turns: a queued control, the step's turn limit and the soft duration each end the call,
and its records reach the loop once, in order, whether copied or handed over whole. Each check
runs for a reader holding its records as a list of rows and as an Arrow record batch."""

from __future__ import annotations

import itertools

import pyarrow as pa

from engine.sourceruntime import CommandKind, MailboxLimits, WorkerBudget
from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.lifecycle import Life
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.reader import TURNS_PER_STEP, PollContext, ReaderEventLoop, rows_of
from tests.source_conformance import ArrivingMailbox, admit

#: How a reader holds its records: a list of rows, or one record batch.
FORMS = ("rows", "arrow")


def held(rows: list[tuple], form: str) -> list[tuple] | pa.RecordBatch:
    """``rows`` (pairs of a string and an int) as the reader holds them in ``form``."""
    if form == "rows":
        return rows
    return pa.RecordBatch.from_pydict(
        {"s": [r[0] for r in rows], "n": [r[1] for r in rows]},
        schema=pa.schema([("s", pa.string()), ("n", pa.int64())]),
    )


class Clock:
    """Deterministic time, each reading ``step`` on from the last, readings counted."""

    def __init__(self, step: float = 0.0) -> None:
        self.now, self.step, self.calls = 0.0, step, 0

    def __call__(self) -> float:
        self.calls += 1
        self.now += self.step
        return self.now


class RunReader:
    """One split of ``size`` records held in one list or record batch (``form``), emitted as
    runs of turns (``emit_turns``; else turn by turn with ``next_turn``); the offset is its
    state. ``rows`` are its records as rows, ``data`` as it holds them."""

    def __init__(self, size: int, emit_turns: bool = True, form: str = "rows") -> None:
        self.rows = [("r", n) for n in range(size)]
        self.data = held(self.rows, form)
        self.offset, self.emit_turns, self.assigned = 0, emit_turns, False

    def add_splits(self, splits):
        self.assigned = True

    def notify_no_more_splits(self):
        pass

    def poll(self, context: PollContext) -> PollStatus:
        if not self.assigned:
            return PollStatus.NOTHING_AVAILABLE
        if self.emit_turns:
            self.offset += context.emit_turns(self.data, self.offset, len(self.rows), 8)
        else:
            while self.offset < len(self.rows):
                stop = min(self.offset + context.remaining_records, len(self.rows))
                context.emit_slice(self.data, self.offset, stop, 8)
                self.offset = stop
                if self.offset == len(self.rows) or not context.next_turn():
                    break
        if self.offset < len(self.rows):
            return PollStatus.MORE_AVAILABLE
        return PollStatus.END_OF_INPUT

    def snapshot(self):
        return self.offset

    def wakeup(self):
        pass


def running(reader, clock, **limits):
    box = ArrivingMailbox(1, "1/1", 1, MailboxLimits(), WorkerBudget(10**9), clock=clock)
    out, batches, snaps = [], [], []

    def emit(part):  # a step's part: a list of rows, or a record batch
        batches.append(part)
        out.extend(rows_of([part]))

    loop = ReaderEventLoop(
        box,
        reader,
        PollLimits(**limits),
        emit,
        lambda s: snaps.append((s.state, len(out))),
        "digest",
        clock=clock,
    )
    loop.start()
    admit(box, CommandKind.ASSIGN_SPLITS, {"splits": ["r"]})
    loop.step()
    return loop, box, out, batches, snaps


def test_a_step_of_runs_is_whole_turns_up_to_the_step_limit_then_the_rest_of_the_rows():
    for emit_turns, form in itertools.product((True, False), FORMS):
        reader = RunReader(64 * TURNS_PER_STEP + 10, emit_turns, form)
        loop, _, out, batches, _ = running(reader, Clock())
        loop.step()
        assert loop.metrics.poll_turns == TURNS_PER_STEP and len(out) == 64 * TURNS_PER_STEP
        assert len(batches) == 1 and out == reader.rows[: len(out)]  # one part a step
        loop.step()
        assert out == reader.rows and loop.metrics.poll_turns == TURNS_PER_STEP + 1
        assert loop.close_latched  # END_OF_INPUT after the last, partial turn


def test_a_whole_list_or_batch_emitted_turn_by_turn_is_handed_over_as_it_is():
    for form in FORMS:
        reader = RunReader(64 * TURNS_PER_STEP, form=form)
        loop, _, _, batches, _ = running(reader, Clock())
        loop.step()
        assert len(batches) == 1 and batches[0] is reader.data, form


def test_the_turns_of_part_of_a_batch_are_handed_over_as_one_slice_of_it_not_a_copy():
    reader = RunReader(64 * TURNS_PER_STEP + 10, form="arrow")
    loop, _, out, batches, _ = running(reader, Clock())
    loop.step()
    loop.step()
    assert [b.num_rows for b in batches] == [64 * TURNS_PER_STEP, 10] and out == reader.rows
    for part in batches:  # zero-copy slices: the batch's own buffers
        for column, sliced in zip(reader.data.columns, part.columns, strict=True):
            assert sliced.buffers()[1].address == column.buffers()[1].address


def barriers(box, when) -> None:
    """A checkpoint barrier admitted at each of the event loop's checks for queued work (the
    points between two turns) that ``when(check)`` picks."""
    checkpoints = itertools.count(1)

    def on_check(checks: int) -> None:
        if when(checks):
            admit(box, CommandKind.CHECKPOINT, {"checkpoint": next(checkpoints)})

    box.on_check = on_check


def test_a_control_queued_during_a_run_ends_it_after_the_turn_in_progress():
    for emit_turns, form in itertools.product((True, False), FORMS):
        for arrives_at in (3, 4, 5, 17, 40, 200):
            reader = RunReader(10_000, emit_turns, form)
            loop, box, out, _, snaps = running(reader, Clock(), max_records=10)
            at = box.checks + arrives_at
            barriers(box, lambda checks, at=at: checks == at)
            loop.step()
            # The check at which it arrived ends the run: the turns before it, none after.
            assert loop.metrics.poll_turns == arrives_at and len(out) == 10 * arrives_at
            loop.step()  # the barrier, before any further turn
            assert snaps == [(len(out), len(out))], (emit_turns, form, arrives_at)


def test_a_cancel_signalled_during_a_run_ends_it_after_the_turn_in_progress():
    for emit_turns, form in itertools.product((True, False), FORMS):
        for arrives_at in (1, 2, 9, 40, 200):
            reader = RunReader(10_000, emit_turns, form)
            loop, box, out, _, _ = running(reader, Clock(), max_records=10)
            at = box.checks + arrives_at

            def cancel(checks, at=at, box=box):
                if checks == at:
                    box.signal_terminal(CommandKind.CANCEL, "COMMAND")

            box.on_check = cancel
            loop.step()
            assert loop.metrics.poll_turns == arrives_at and len(out) == 10 * arrives_at
            loop.step()  # the terminal signal first: no further turn
            assert loop.life.state == Life.CLOSED and len(out) == 10 * arrives_at


def test_every_snapshot_holds_exactly_the_records_emitted_before_it():
    for every, form in itertools.product((2, 3, 7, 31), FORMS):
        reader = RunReader(5_000, form=form)
        loop, box, out, _, snaps = running(reader, Clock(), max_records=16)
        barriers(box, lambda checks, every=every: checks % every == 0)
        while loop.step():
            pass
        assert out == reader.rows and len(snaps) >= 5
        assert all(state == emitted for state, emitted in snaps)


def test_a_turn_past_its_soft_duration_ends_the_call_and_its_overrun_is_counted_once():
    for emit_turns, form in itertools.product((True, False), FORMS):
        reader = RunReader(10_000, emit_turns, form)
        clock = Clock(step=0.006)  # each reading 6 ms on: every turn outlasts a 5 ms budget
        loop, _, out, _, _ = running(reader, clock, max_records=10, soft=0.005)
        calls = clock.calls
        loop.step()
        # Never two turns in one call: the loop starts each. The clock is read once to start,
        # once after each turn, and in each next_turn but the last (no turns left by then).
        assert loop.metrics.poll_turns == TURNS_PER_STEP
        assert clock.calls - calls == 1 + TURNS_PER_STEP + TURNS_PER_STEP - 1
        assert loop.metrics.soft_overruns == TURNS_PER_STEP and len(out) == 10 * TURNS_PER_STEP


def test_a_context_outside_the_event_loop_never_goes_on_to_another_turn():
    rows = [("r", n) for n in range(100)]
    for form in FORMS:
        context = PollContext(PollLimits(max_records=10), lambda: 0.0, 0.0)
        assert context.emit_turns(held(rows, form), 0, 100, 8) == 10 and not context.next_turn()
        assert context.records == rows[:10] and context.bytes == 80


def test_a_byte_budget_smaller_than_the_record_budget_bounds_every_turn():
    for form in FORMS:
        reader = RunReader(1_000, form=form)
        loop, _, out, _, _ = running(reader, Clock(), max_records=64, max_bytes=80)
        loop.step()
        assert len(out) == 10 * loop.metrics.poll_turns  # 8 bytes a record: 10 to a turn


def test_a_record_larger_than_the_byte_budget_still_goes_alone_in_its_turn():
    for form in FORMS:
        reader = RunReader(TURNS_PER_STEP + 100, form=form)
        loop, _, out, _, _ = running(reader, Clock(), max_records=64, max_bytes=4)
        loop.step()
        assert len(out) == loop.metrics.poll_turns == TURNS_PER_STEP  # one record a turn


class BlocksReader:
    """One split held as blocks of ``block`` records (not a multiple of a turn's), lists of
    rows or record batches (``form``), each emitted by ``emit_turns`` in the same ``poll`` call
    as the block before it: a turn that the end of a block leaves open goes on into the next
    block with what its budget has left."""

    def __init__(self, blocks: int, block: int, form: str = "rows") -> None:
        self.rows = [[(f"b{b}", n) for n in range(block)] for b in range(blocks)]
        self.blocks = [held(rows, form) for rows in self.rows]
        self.block, self.offset, self.assigned = block, 0, False

    add_splits = RunReader.add_splits
    notify_no_more_splits = RunReader.notify_no_more_splits
    snapshot = RunReader.snapshot
    wakeup = RunReader.wakeup

    def poll(self, context: PollContext) -> PollStatus:
        if not self.assigned:
            return PollStatus.NOTHING_AVAILABLE
        while self.offset < self.block * len(self.blocks):
            rows = self.blocks[self.offset // self.block]
            start = self.offset % self.block
            emitted = context.emit_turns(rows, start, self.block, 8)
            self.offset += emitted
            if start + emitted < self.block or not context.remaining_records:
                return PollStatus.MORE_AVAILABLE  # the run ended, or its last turn is full
        return PollStatus.END_OF_INPUT


def test_a_turn_left_open_by_the_end_of_a_list_goes_on_with_what_its_budget_has_left():
    for form in FORMS:
        reader = BlocksReader(blocks=TURNS_PER_STEP // 2, block=25, form=form)
        loop, _, out, batches, _ = running(reader, Clock(), max_records=10)
        loop.step()
        # Every turn full, none over: a turn that spans two blocks takes 5 from each.
        assert loop.metrics.poll_turns == TURNS_PER_STEP and len(out) == 10 * TURNS_PER_STEP
        assert out == [r for rows in reader.rows for r in rows][: len(out)]
        if form == "arrow":  # several batches in a step: each a part, never joined
            whole = len(out) // 25
            assert len(batches) == whole + 1 and batches[-1].num_rows == len(out) % 25
            assert all(b is blk for b, blk in zip(batches, reader.blocks[:whole], strict=False))


def test_rows_and_batches_emitted_in_one_step_are_its_parts_in_order():
    """Rows emitted one after another are one list (the task group converts it once), a
    batch between them a part of its own: the order is kept."""
    rows = [("r", n) for n in range(6)]
    batch = held([("b", n) for n in range(4)], "arrow")
    context = PollContext(PollLimits(), lambda: 0.0, 0.0)
    context.emit(rows[0])
    context.emit_many(rows[1:3])
    context.emit_slice(batch, 0, 2)
    context.emit_slice(batch, 2, 4)  # goes on where the last ended: one part, the batch
    context.emit_slice(rows, 3, 6)
    parts = context.settle()
    assert parts == [rows[:3], batch, rows[3:]] and parts[1] is batch
    assert rows_of(parts) == [*rows[:3], *rows_of([batch]), *rows[3:]]


def test_the_context_never_changes_a_list_the_reader_lent_it():
    rows = [("r", n) for n in range(5)]
    adds = {
        "emit": lambda context: context.emit(("x", 0)),
        "emit_many": lambda context: context.emit_many([("x", 0)]),
        "emit_slice": lambda context: context.emit_slice([("x", 0)], 0, 1),
    }
    for name, add in adds.items():
        context = PollContext(PollLimits(), lambda: 0.0, 0.0)
        context.emit_slice(rows, 0, 5)
        assert context.settle()[0] is rows  # handed over whole, uncopied
        add(context)
        assert rows == [("r", n) for n in range(5)], name
        assert context.settle() == [[*rows, ("x", 0)]]  # the rows still one part
