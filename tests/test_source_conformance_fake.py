"""FakeSource's managed reader passes the managed Source conformance suite."""

from __future__ import annotations

from itertools import groupby

import pyarrow as pa
import pytest

from engine.connectors.batches import limits, to_rows
from engine.connectors.fake import FakeSource
from engine.connectors.fake_managed import CAPABILITY, ManagedFakeReader
from engine.jobs.planner import plan_job
from engine.sourceruntime.reader import rows_of
from tests.source_conformance import *  # noqa: F403 - the suite's tests run for this connector
from tests.source_conformance import Subject, collecting, under_the_loop


@pytest.fixture
def managed():
    # row.num is rows per reader, cut into split.num splits: 40 rows each.
    plan = plan_job("source { FakeSource { row.num = 120, split.num = 3 } }\nsink { Blackhole {} }")
    node = plan.pipelines[0].source
    source = FakeSource(node.config, node.path)
    return Subject(
        make=lambda: ManagedFakeReader(source),
        splits=source.create_splits("BATCH"),
        rows_per_split=40,
        capability=CAPABILITY,
    )


def source_of(options: str) -> FakeSource:
    plan = plan_job(f"source {{ FakeSource {{ {options} }} }}\nsink {{ Blackhole {{}} }}")
    node = plan.pipelines[0].source
    return FakeSource(node.config, node.path)


def lane_b_rows(source: FakeSource) -> dict[str, list]:
    """Each BATCH split's rows as Lane B reads them, by split id."""
    return {
        split["splitId"]: [
            r
            for batch, _ in source.read(split, 0, "BATCH", 4096)
            for r in to_rows(batch, source.output_schema())
        ]
        for split in source.create_splits("BATCH")
    }


def owners(source: FakeSource) -> dict[tuple, str]:
    """The split id of every row (FakeSource's rows are distinct)."""
    return {row: split_id for split_id, rows in lane_b_rows(source).items() for row in rows}


def test_a_paced_split_never_blocks_a_turn_and_says_when_it_has_more():
    """rows.per-second: a turn takes what is due and returns; with nothing due the reader says
    when (``retry_at``), its availability future completes then (the shared timers) and the
    event loop, woken by that AVAILABLE command, polls again (it keeps no timer of its own)."""
    from engine.sourceruntime.limits import MailboxLimits, PollLimits
    from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
    from engine.sourceruntime.reader import ReaderEventLoop

    now = [100.0]
    source = source_of("row.num = 30, split.num = 1, rows.per-second = 10")
    reader = ManagedFakeReader(source, clock=lambda: now[0])
    mailbox = ReaderMailbox(1, "1/0", 1, MailboxLimits(), WorkerBudget(10**9))
    out: list = []
    loop = ReaderEventLoop(
        mailbox, reader, PollLimits(), collecting(out), lambda s: None, "", clock=lambda: now[0]
    )
    loop.start()
    reader.add_splits(source.create_splits("BATCH"))
    loop.step()
    assert len(out) == 1 and reader.retry_at == pytest.approx(100.1)  # one row due at start
    assert not loop.step() and loop.retry_at is None and loop.idle_for(1.0) == 1.0
    now[0] = 100.55
    loop.availability.awaited.result(timeout=10)  # its timer: 0.1 s from when it was asked
    assert loop.step() and loop.availability.wakeups == 1  # the AVAILABLE command
    loop.step()
    assert len(out) == 6  # rows due by 0.55 s: 0.0, 0.1, ... 0.5
    now[0] = 104.0
    reader.notify_no_more_splits()
    loop.availability.awaited.result(timeout=10)
    while loop.step():
        pass
    assert [r[0] for r in out] == list(range(30)) and loop.close_latched


def test_the_rows_option_is_what_every_managed_split_emits():
    source = source_of(
        "split.num = 2, schema { fields { id = bigint } }, rows = [{ fields = [7] }, "
        "{ kind = DELETE, fields = [8] }]"
    )
    reader = ManagedFakeReader(source)
    reader.add_splits(source.create_splits("BATCH"))
    reader.notify_no_more_splits()
    from engine.sourceruntime.limits import PollLimits
    from engine.sourceruntime.reader import PollContext

    rows = []
    while True:
        context = PollContext(PollLimits(), lambda: 0.0, 0.0)
        status = reader.poll(context)
        rows += context.records
        if status.value == "END_OF_INPUT":
            break
    assert rows == source.listed_rows() * 2


def test_under_the_loop_the_managed_rows_are_lane_bs_across_its_read_ahead_blocks():
    """The steady-state path (runs of turns out of a block built ahead, a block a split in
    turn) emits Lane B's rows, in each split's order, and every snapshot resumes after exactly
    what was emitted, wherever in a block it was taken."""
    from collections import Counter

    read_ahead = ManagedFakeReader(source_of("row.num = 1")).read_ahead
    assert read_ahead == limits()[0]  # both lanes build blocks of the data plane's batch size
    for split_num in (1, 3):
        source = source_of(f"row.num = {2 * read_ahead + 100}, split.num = {split_num}")
        splits = source.create_splits("BATCH")
        lane_b = lane_b_rows(source)
        out, snaps = under_the_loop(ManagedFakeReader(source), splits, every=7)
        if split_num == 1:
            assert out == lane_b["fake-0"]
        assert Counter(out) == Counter(r for rows in lane_b.values() for r in rows)
        assert len(snaps) > 20
        for state, emitted in snaps[:: max(len(snaps) // 8, 1)]:
            again = ManagedFakeReader(source)
            again.restore(state)
            rest, _ = under_the_loop(again, [], every=5)
            assert Counter(out[:emitted] + rest) == Counter(out)
            if split_num == 1:
                assert rest == lane_b["fake-0"][emitted:]


class CountingBuilds(ManagedFakeReader):
    """FakeSource's managed reader, counting the rows it builds (as rows or as blocks) and
    keeping the blocks it built."""

    def __init__(self, source: FakeSource, **kw) -> None:
        super().__init__(source, **kw)
        self.built, self.blocks, build, build_block = 0, [], self.build, self.build_block

        def counted(ids):
            rows = build(ids)
            self.built += len(rows)
            return rows

        def counted_block(ids):
            block = build_block(ids)
            self.built += block.num_rows
            self.blocks.append(block)
            return block

        self.build, self.build_block = counted, counted_block


def test_many_splits_take_turns_a_block_each_and_every_row_is_built_once():
    """The splits take turns in id order, a block of ``read_ahead`` rows (or what the split
    has left) each, and one block is held at a time: rows built == rows emitted."""
    for split_num in (3, 11):
        per_split = limits()[0] + 904
        source = source_of(f"row.num = {per_split * split_num}, split.num = {split_num}")
        splits = source.create_splits("BATCH")
        owner = owners(source)
        reader = CountingBuilds(source)
        out, _ = under_the_loop(reader, splits, every=10**9)
        assert len(out) == per_split * split_num and reader.built == len(out)
        runs = [(split, len(list(rows))) for split, rows in groupby(owner[row] for row in out)]
        ring = sorted(set(owner.values()))  # the splits by id
        assert runs == [(s, reader.read_ahead) for s in ring] + [(s, 904) for s in ring]


def test_a_paced_reader_builds_only_the_rows_that_are_due():
    now = [0.0]
    source = source_of("row.num = 10000, split.num = 20, rows.per-second = 50")
    reader = CountingBuilds(source, clock=lambda: now[0])
    reader.add_splits(source.create_splits("BATCH"))
    from engine.sourceruntime.limits import PollLimits
    from engine.sourceruntime.reader import PollContext

    emitted = 0
    for _ in range(200):
        now[0] += 0.05
        context = PollContext(PollLimits(), lambda: now[0], now[0])
        reader.poll(context)
        emitted += len(context.records)
    assert emitted and reader.built == emitted


def test_after_a_barrier_the_steps_realign_with_the_blocks_and_hand_them_over_whole():
    """A barrier between two turns ends a step inside a block; the next step ends with that
    block (end_step), and every later step is one whole block, handed over as the record
    batch the reader built (the two parts of the first: zero-copy slices of it). On the
    suite's pinned clock: step sizes are the reader's and the budgets', not the machine's."""
    from engine.sourceruntime.choices import CommandKind
    from engine.sourceruntime.lifecycle import Life
    from engine.sourceruntime.limits import MailboxLimits, PollLimits
    from engine.sourceruntime.mailbox import WorkerBudget
    from engine.sourceruntime.reader import ReaderEventLoop
    from tests.source_conformance import ArrivingMailbox, admit, pinned_clock

    read_ahead = limits()[0]
    source = source_of(f"row.num = {5 * read_ahead}, split.num = 1")
    box = ArrivingMailbox(1, "1/1", 1, MailboxLimits(), WorkerBudget(10**9))
    batches, snaps = [], []
    reader = CountingBuilds(source)
    loop = ReaderEventLoop(
        box,
        reader,
        PollLimits(),
        batches.append,
        snaps.append,
        "d",
        clock=pinned_clock,
    )
    loop.start()
    admit(box, CommandKind.ASSIGN_SPLITS, {"splits": source.create_splits("BATCH")})
    admit(box, CommandKind.NO_MORE_SPLITS)
    at = box.checks + 10  # the tenth check of the first step with rows: after ten turns

    def barrier(checks):
        if checks == at:
            admit(box, CommandKind.CHECKPOINT, {"checkpoint": 1})

    box.on_check = barrier
    while loop.life.state != Life.CLOSED and loop.step():
        pass
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert [b.num_rows for b in batches] == [640, read_ahead - 640] + [read_ahead] * 4
    assert len(snaps) == 1 and snaps[0].state["offsets"]["fake-0"] == 640
    assert all(b is block for b, block in zip(batches[2:], reader.blocks[1:], strict=True))
    first = reader.blocks[0].column(0).buffers()[1].address
    assert all(b.column(0).buffers()[1].address == first for b in batches[:2])  # not copied
    assert rows_of(batches) == lane_b_rows(source)["fake-0"]


def test_a_split_assigned_mid_block_waits_until_the_current_block_is_out():
    """Splits assigned while a block is being read (one whose id sorts before the current
    split's) change nothing of it: the block goes on where it was, and no row is built twice."""
    from collections import Counter

    from engine.sourceruntime.limits import PollLimits
    from engine.sourceruntime.reader import PollContext

    read_ahead = limits()[0]
    per_split = read_ahead + 904
    source = source_of(f"row.num = {3 * per_split}, split.num = 3")
    splits = {s["splitId"]: s for s in source.create_splits("BATCH")}
    owner = owners(source)
    reader = CountingBuilds(source)
    reader.add_splits([splits["fake-1"], splits["fake-2"]])
    out = []

    def turn():  # one turn a call: no event loop to go on with
        context = PollContext(PollLimits(), lambda: 0.0, 0.0)
        status = reader.poll(context)
        out.extend(context.records)
        return status

    for _ in range(read_ahead // 64 + 10):  # fake-1's first block, then ten turns of fake-2's
        turn()
    assert [owner[r] for r in out[-640:]] == ["fake-2"] * 640
    reader.add_splits([splits["fake-0"]])
    reader.notify_no_more_splits()
    turn()
    assert owner[out[-1]] == "fake-2" and len(out) == read_ahead + 704
    while turn().value != "END_OF_INPUT":
        pass
    assert Counter(out) == Counter(owner.keys()) and reader.built == len(out) == 3 * per_split
