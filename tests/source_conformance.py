"""The managed Source conformance suite: what a connector's managed reader must do to run in
Lane A. A connector's test module provides a ``managed`` fixture returning a ``Subject`` (a
factory of fresh readers with the splits they read and the rows each split holds) and imports
these tests. Each check runs the reader under the real event loop where ordering matters, on a
pinned clock: a turn ends by its record and byte budgets or by the reader, never because the
machine is loaded (the time budget is the loop's, tested with clocks the tests move). What must
not block (a poll call, a wakeup) runs on a thread of its own, so a reader that blocks fails a
check rather than hanging it."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.sourceruntime.choices import CommandKind, PollStatus
from engine.sourceruntime.envelope import SourceCommandEnvelope
from engine.sourceruntime.lifecycle import Life
from engine.sourceruntime.limits import MailboxLimits, PollLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from engine.sourceruntime.reader import TURNS_PER_STEP, PollContext, ReaderEventLoop, rows_of
from engine.sourceruntime.watchdog import wake_of


@dataclass
class Subject:
    make: Callable[[], object]  # a fresh reader
    splits: list[dict]  # what the enumerator would assign
    rows_per_split: int  # rows each split holds (BATCH)
    capability: object  # its ManagedSourceCapability


def pinned_clock() -> float:
    """Time stands still for the suite's poll turns and event loops."""
    return 0.0


def collecting(out: list, on_part: Callable[[object], None] = lambda part: None) -> Callable:
    """An event loop's ``emit``: each part it hands over (a record batch, or a list of rows)
    shown to ``on_part`` as it is, its records added to ``out`` as rows."""
    return lambda part: (on_part(part), out.extend(rows_of([part])))


def turn(reader, limits: PollLimits | None = None, clock=pinned_clock, contexts=None):
    """One poll call of one turn, as the event loop makes it: a wakeup that came before it
    is cleared as it starts. Its records come back as rows (``PollContext.records``)."""
    context = PollContext(limits or PollLimits(), clock, clock(), wake=wake_of(reader))
    context.wake.woken = False
    status = reader.poll(context)
    if contexts is not None:
        contexts.append(context)
    return status, context.records


def read_all(reader, limits: PollLimits | None = None, turns: int = 100_000) -> list:
    rows = []
    for _ in range(turns):
        status, records = turn(reader, limits)
        rows += records
        if status != PollStatus.MORE_AVAILABLE:
            return rows
    raise AssertionError("the reader never stopped reporting MORE_AVAILABLE")


def on_a_thread(fn: Callable[[], object], budget: float, what: str) -> object:
    """``fn()`` on a thread of its own (as a task group's thread runs a reader), which must
    return within ``budget`` seconds; a thread that does not is left behind."""
    done: dict = {}

    def run() -> None:
        try:
            done["value"] = fn()
        except BaseException as exc:  # handed to the test's thread
            done["error"] = exc

    thread = threading.Thread(target=run, name="conformance-reader", daemon=True)
    thread.start()
    thread.join(budget)
    assert not thread.is_alive(), f"{what} did not return within {budget} s: it blocks"
    if "error" in done:
        raise done["error"]
    return done["value"]


class WokenContext(PollContext):
    """A poll context that runs ``during()`` as the reader emits its first records (once): a
    wakeup that arrives while a poll call is in progress."""

    __slots__ = ("during",)

    def _emitting(self) -> None:
        during, self.during = self.during, None
        if during is not None:
            during()

    def emit(self, record: tuple, size: int = 0) -> None:
        self._emitting()
        super().emit(record, size)

    def emit_many(self, records: list[tuple], size_each: int = 0) -> None:
        self._emitting()
        super().emit_many(records, size_each)

    def emit_slice(self, rows, start: int, stop: int, size_each: int = 0) -> None:
        self._emitting()
        super().emit_slice(rows, start, stop, size_each)

    def emit_turns(self, rows, start: int, stop: int, size_each: int = 0) -> int:
        self._emitting()
        return super().emit_turns(rows, start, stop, size_each)


def call(reader, limits: PollLimits, clock=pinned_clock, during=None) -> tuple:
    """One poll call as the event loop makes it in a step, free to go on with further turns
    (nothing is queued), ``during()`` run as the reader emits its first records; its records
    as rows."""
    box = ReaderMailbox(1, "1/1", 1, MailboxLimits(), WorkerBudget(10**9))
    context = WokenContext(limits, clock, clock(), box, wake_of(reader))
    context.during, context.turns_left = during, TURNS_PER_STEP - 1
    context.wake.woken = False
    status = reader.poll(context)
    return status, rows_of(context.settle())


def test_a_poll_turn_never_blocks_even_with_nothing_to_read(managed):
    reader = managed.make()
    status, records = on_a_thread(lambda: turn(reader), PollLimits().hard, "a poll call")
    assert (status, records) == (PollStatus.NOTHING_AVAILABLE, [])


def test_a_poll_with_splits_assigned_never_blocks_and_keeps_to_its_soft_duration(managed):
    """On the real clock, with splits assigned, every turn until the end of the input returns
    within the hard budget (a turn that waits is not bounded);
    on a clock past its soft deadline at every reading, a call goes on with no further turn."""
    limits = PollLimits()
    reader = managed.make()
    reader.add_splits(managed.splits)
    reader.notify_no_more_splits()

    def read() -> tuple[list, list]:
        durations, rows = [], []
        for _ in range(100_000):
            started = time.perf_counter()
            status, records = turn(reader, limits, clock=time.monotonic)
            durations.append(time.perf_counter() - started)
            rows += records
            if status != PollStatus.MORE_AVAILABLE:
                return durations, rows
        raise AssertionError("the reader never stopped reporting MORE_AVAILABLE")

    durations, rows = on_a_thread(read, limits.hard, "reading with splits assigned")
    assert len(rows) == managed.rows_per_split * len(managed.splits)
    # Only the hard budget on the real clock (a loaded machine stretches any turn); the soft
    # duration's rule is checked on the pinned clock below.
    assert max(durations) < limits.hard
    late = itertools.count(step=2 * limits.soft)  # each reading is past the last deadline
    reader = managed.make()
    reader.add_splits(managed.splits)
    status, records = call(reader, limits, clock=lambda: next(late))
    assert status == PollStatus.MORE_AVAILABLE and 0 < len(records) <= limits.max_records


def test_a_poll_turn_stays_within_its_record_and_byte_budgets(managed):
    reader = managed.make()
    reader.add_splits(managed.splits)
    for limits in (PollLimits(max_records=7), PollLimits(max_records=10**6, max_bytes=1000)):
        contexts = []
        _, records = turn(reader, limits, contexts=contexts)
        assert 0 < len(records) <= limits.max_records
        assert contexts[0].bytes <= limits.max_bytes


def test_no_availability_is_lost_between_nothing_available_and_an_assignment(managed):
    reader = managed.make()
    assert turn(reader)[0] == PollStatus.NOTHING_AVAILABLE
    reader.add_splits(managed.splits[:1])
    _, records = turn(reader)
    assert records


def wake(reader, times: int) -> None:
    """``times`` wakeups of ``reader``: all but one from other threads at once, then one.
    Each returns at once: a wakeup never blocks."""
    threads = [threading.Thread(target=reader.wakeup) for _ in range(times - 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
        assert not t.is_alive(), "wakeup() blocks"
    reader.wakeup()


def differs(once: tuple, many: tuple) -> str:
    """Where reading woken nine times first went otherwise (this module's asserts are not
    rewritten by pytest: they say it themselves)."""
    turns = list(itertools.zip_longest(once[0], many[0]))
    n = next((n for n, (a, b) in enumerate(turns) if a != b), None)
    if n is None:
        return f"the state after differs: {once[1]} once, {many[1]} woken nine times"
    return f"turn {n} differs: {turns[n][0]} once, {turns[n][1]} woken nine times"


def test_wakeup_is_idempotent_and_safe_from_other_threads(managed):
    """Woken once, or nine times at once from other threads, before every turn: the same turns
    (statuses and rows), the same state after, every row once. A wakeup only interrupts."""

    def read_woken(times: int) -> tuple[list, object]:
        reader = managed.make()
        wake(reader, times)
        assert turn(reader)[0] in (PollStatus.NOTHING_AVAILABLE, PollStatus.MORE_AVAILABLE)
        reader.add_splits(managed.splits)
        reader.notify_no_more_splits()
        turns = []
        for _ in range(100_000):
            wake(reader, times)
            turns.append(turn(reader, PollLimits(max_records=7)))
            if turns[-1][0] != PollStatus.MORE_AVAILABLE:
                break
        return turns, json.loads(json.dumps(reader.snapshot()))

    once, many = read_woken(1), read_woken(9)
    assert many == once, differs(once, many)
    rows = [row for _, records in once[0] for row in records]
    assert len(rows) == len(set(rows)) == managed.rows_per_split * len(managed.splits)


def test_a_wakeup_during_a_poll_call_ends_it_at_its_next_boundary_and_loses_nothing(managed):
    """Woken nine times at once from other threads while every other call emits its first
    records, and again after every call: each woken call ends at its next turn or record
    boundary (one turn's records at most, though it was free to go on), the next call goes on
    where it ended, and every row is read once."""
    limits = PollLimits(max_records=7)
    reader = managed.make()
    reader.add_splits(managed.splits)
    reader.notify_no_more_splits()
    rows = []
    for n in range(100_000):
        woken = n % 2 == 0
        status, records = call(reader, limits, during=(lambda: wake(reader, 9)) if woken else None)
        if woken:
            assert len(records) <= limits.max_records, f"a woken call emitted {len(records)}"
        wake(reader, 9)
        rows += records
        if status != PollStatus.MORE_AVAILABLE:
            break
    assert status == PollStatus.END_OF_INPUT
    assert len(rows) == len(set(rows)) == managed.rows_per_split * len(managed.splits)


def test_a_poll_in_progress_returns_within_the_hard_budget_after_wakeup(managed):
    """A call free to read everything (no record, byte or time budget in its way) runs on a
    thread of its own; woken from this thread again and again from when it starts (one wakeup
    may come before the call clears the last), it returns within the hard budget, and the
    next calls read the rest."""
    limits = PollLimits(max_records=10**9, max_bytes=10**15, soft=3600.0)
    reader = managed.make()
    reader.add_splits(managed.splits)
    reader.notify_no_more_splits()
    calling, done = threading.Event(), {}

    def poll() -> None:
        calling.set()
        done["call"] = call(reader, limits)

    thread = threading.Thread(target=poll, name="conformance-reader", daemon=True)
    thread.start()
    assert calling.wait(5)
    deadline = time.monotonic() + limits.hard
    while thread.is_alive() and time.monotonic() < deadline:
        reader.wakeup()
        thread.join(0.01)
    assert not thread.is_alive(), "a poll call did not return within the hard budget of wakeup()"
    status, rows = done["call"]
    if status == PollStatus.MORE_AVAILABLE:
        rows = rows + read_all(reader)
    assert len(rows) == len(set(rows)) == managed.rows_per_split * len(managed.splits)


def test_state_and_emitted_records_advance_together(managed):
    """After any turn, a restore from the snapshot continues exactly after what was emitted:
    every row once, across any number of restores."""
    reader = managed.make()
    reader.add_splits(managed.splits)
    reader.notify_no_more_splits()
    seen = []
    for n in range(1000):
        status, records = turn(reader, PollLimits(max_records=3 + n % 5))
        seen += records
        if status == PollStatus.END_OF_INPUT:
            break
        state = reader.snapshot()
        reader = managed.make()
        reader.restore(state)
        reader.notify_no_more_splits()
    assert len(seen) == len(set(seen)) == managed.rows_per_split * len(managed.splits)


_command_ids = itertools.count()


def envelope_for(box: ReaderMailbox, kind: CommandKind, payload=None, attempt: int = 1):
    """A command to ``box`` from sender attempt 1, its sequences 0, 1, 2, ... per mailbox."""
    n = next(_command_ids)
    box.sent = getattr(box, "sent", -1) + 1
    return SourceCommandEnvelope.build(
        job_id=box.job_id,
        source_runtime_id=box.runtime_id,
        epoch=1,
        sender_attempt=1,
        target_attempt=attempt,
        sequence=box.sent,
        command_id=f"c{n}",
        kind=kind,
        payload=json.dumps(payload).encode() if payload is not None else b"",
    )


def admit(box: ReaderMailbox, kind: CommandKind, payload=None, attempt: int = 1):
    """``box``'s answer to a command built by ``envelope_for``."""
    return box.admit(envelope_for(box, kind, payload, attempt))


class ArrivingMailbox(ReaderMailbox):
    """A reader mailbox that calls ``on_check(n)`` at the n-th check the event loop makes for
    queued work (``has_work``, or the turns' inline read of ``commands``): exactly the points
    between two poll turns where a command admitted by another thread is first seen, so a
    test admits its commands there."""

    def __init__(self, *args, on_check: Callable[[int], None] = lambda n: None, **kw) -> None:
        self.on_check, self.checks = on_check, 0
        super().__init__(*args, **kw)

    @property
    def commands(self) -> int:
        if "_lock" in self.__dict__ and not self._lock.locked():  # not within admit or take
            self.checks += 1
            self.on_check(self.checks)
        return self.__dict__["_commands"]

    @commands.setter
    def commands(self, value: int) -> None:
        self.__dict__["_commands"] = value


def under_the_loop(
    reader,
    splits: list[dict],
    every: int,
    limits: PollLimits | None = None,
    on_part: Callable[[object], None] = lambda part: None,
) -> tuple[list, list]:
    """The reader under the real event loop, given ``splits`` then no more, a barrier arriving
    at every n-th check for queued work: the rows in the order emitted and, for each snapshot,
    (its state as checkpointed, how many rows had been emitted by then). ``on_part`` sees each
    part the loop hands over as it is (a record batch, or a list of rows)."""
    checkpoints = itertools.count(1)

    def arrive(checks: int) -> None:
        if checks % every == 0:
            admit(box, CommandKind.CHECKPOINT, {"checkpoint": next(checkpoints)})

    box = ArrivingMailbox(1, "1/1", 1, MailboxLimits(), WorkerBudget(10**9), on_check=arrive)
    out, snaps = [], []
    loop = ReaderEventLoop(
        box,
        reader,
        limits or PollLimits(),
        collecting(out, on_part),
        lambda s: snaps.append((json.loads(json.dumps(s.state)), len(out))),
        "digest",
        clock=pinned_clock,
    )
    loop.start()
    if splits:
        admit(box, CommandKind.ASSIGN_SPLITS, {"splits": splits})
    admit(box, CommandKind.NO_MORE_SPLITS)
    for _ in range(100_000):
        if loop.life.state == Life.CLOSED or not loop.step():
            break
    return out, snaps


def test_under_the_event_loop_every_snapshot_resumes_exactly_after_what_was_emitted(managed):
    """Steps of back-to-back turns, barriers arriving between any two of them: each snapshot,
    restored into a fresh reader, reads exactly the rows not emitted when it was taken."""
    for every, max_records in ((3, 4), (2, 16)):
        limits = PollLimits(max_records=max_records)
        out, snaps = under_the_loop(managed.make(), managed.splits, every, limits)
        assert len(out) == len(set(out)) == managed.rows_per_split * len(managed.splits)
        assert len(snaps) >= 3
        for state, emitted in snaps:
            again = managed.make()
            again.restore(state)
            again.notify_no_more_splits()
            rest = read_all(again)
            assert len(rest) == len(out) - emitted and set(out[:emitted] + rest) == set(out)


def test_a_split_assigned_twice_is_read_once_and_callbacks_are_idempotent(managed):
    reader = managed.make()
    reader.add_splits(managed.splits)
    reader.add_splits(managed.splits)
    reader.notify_no_more_splits()
    reader.notify_no_more_splits()
    rows = read_all(reader)
    assert len(rows) == len(set(rows)) == managed.rows_per_split * len(managed.splits)


class Recorded(dict):
    """A reader's state, recording the thread of every change made to it."""

    def __init__(self, data: dict, threads: set[threading.Thread]) -> None:
        super().__init__(data)
        self.threads = threads


def _recording(method: Callable) -> Callable:
    def change(self: Recorded, *args, **kwargs):
        self.threads.add(threading.current_thread())  # not an ident: those are reused
        return method(self, *args, **kwargs)

    return change


for _change in ("__setitem__", "__delitem__", "setdefault", "pop", "popitem", "update", "clear"):
    setattr(Recorded, _change, _recording(getattr(dict, _change)))


def test_its_state_is_changed_on_the_loop_thread_alone_and_it_starts_no_thread(managed):
    """Under the event loop on a thread of its own, while another thread admits its splits,
    barriers and the end of its input and three more wake it again and again: every change to
    its split state (``splits`` and ``offsets``, where it keeps them as dicts) is made on the
    loop's thread, each barrier gets its snapshot, every row is read once, and no thread runs
    afterwards that did not run before."""
    before = set(threading.enumerate())
    reader = managed.make()
    changed_by: set[threading.Thread] = set()
    recorded = False
    for name in ("splits", "offsets"):
        state = getattr(reader, name, None)
        if isinstance(state, dict):
            setattr(reader, name, Recorded(state, changed_by))
            recorded = True
    woken = threading.Event()
    box = ReaderMailbox(1, "1/1", 1, MailboxLimits(), WorkerBudget(10**9), wakeup=woken.set)
    out, snaps = [], []
    loop = ReaderEventLoop(
        box,
        reader,
        PollLimits(max_records=5),
        collecting(out),
        lambda s: snaps.append(s.checkpoint),
        "digest",
        clock=pinned_clock,
    )
    loop.start()

    def run_loop() -> None:
        while loop.life.state != Life.CLOSED:
            woken.clear()
            if not loop.step():
                woken.wait(0.05)

    def operate() -> None:  # one operation thread: a sender's sequences are its own, in order
        for n, split in enumerate(managed.splits):
            admit(box, CommandKind.ASSIGN_SPLITS, {"splits": [split]})
            admit(box, CommandKind.CHECKPOINT, {"checkpoint": n + 1})
        admit(box, CommandKind.NO_MORE_SPLITS)

    def wake_often() -> None:
        for _ in range(200):
            reader.wakeup()

    loop_thread = threading.Thread(target=run_loop, name="conformance-loop")
    others = [threading.Thread(target=operate)] + [
        threading.Thread(target=wake_often) for _ in range(3)
    ]
    for thread in [loop_thread, *others]:
        thread.start()
    for thread in [*others, loop_thread]:
        thread.join(30)
        assert not thread.is_alive(), f"{thread.name} never ended"
    assert len(out) == len(set(out)) == managed.rows_per_split * len(managed.splits)
    assert snaps == list(range(1, len(managed.splits) + 1))
    if recorded:
        assert changed_by == {loop_thread}, "its state was changed off the loop's thread"
    assert set(threading.enumerate()) == before, "it left a thread running"


def test_it_declares_a_versioned_capability_and_no_durable_source_events(managed):
    capability = managed.capability
    assert capability.runtime_protocol_version == 1 and capability.bounded_poll
    assert capability.wakeup and capability.attempt_fencing
    assert not capability.source_events  # no durable custom events without a serializer
    assert len(capability.digest) == 16
    version = type(managed.make()).STATE_VERSION  # recorded with every snapshot
    assert isinstance(version, int) and not isinstance(version, bool) and version >= 1
