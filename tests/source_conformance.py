"""The managed Source conformance suite: what a connector's managed reader must do to run in
Lane A. A connector's test module provides a ``managed`` fixture returning a ``Subject`` (a
factory of fresh readers with the splits they read and the rows each split holds) and imports
these tests. Each check runs the reader under the real event loop where ordering matters, on a
pinned clock: a turn ends by its record and byte budgets or by the reader, never because the
machine is loaded (the time budget is the loop's, tested with clocks the tests move)."""

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
from engine.sourceruntime.reader import PollContext, ReaderEventLoop


@dataclass
class Subject:
    make: Callable[[], object]  # a fresh reader
    splits: list[dict]  # what the enumerator would assign
    rows_per_split: int  # rows each split holds (BATCH)
    capability: object  # its ManagedSourceCapability


def pinned_clock() -> float:
    """Time stands still for the suite's poll turns and event loops."""
    return 0.0


def turn(reader, limits: PollLimits | None = None, clock=pinned_clock, contexts=None):
    context = PollContext(limits or PollLimits(), clock, clock())
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


def test_a_poll_turn_never_blocks_even_with_nothing_to_read(managed):
    reader = managed.make()
    started = time.monotonic()
    status, records = turn(reader)
    assert time.monotonic() - started < PollLimits().hard
    assert (status, records) == (PollStatus.NOTHING_AVAILABLE, [])


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
    """``times`` wakeups of ``reader``: all but one from other threads at once, then one."""
    threads = [threading.Thread(target=reader.wakeup) for _ in range(times - 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
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
    reader, splits: list[dict], every: int, limits: PollLimits | None = None
) -> tuple[list, list]:
    """The reader under the real event loop, given ``splits`` then no more, a barrier arriving
    at every n-th check for queued work: the rows in the order emitted and, for each snapshot,
    (its state as checkpointed, how many rows had been emitted by then)."""
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
        out.extend,
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


def test_no_background_thread_touches_its_state(managed):
    before = threading.active_count()
    reader = managed.make()
    reader.add_splits(managed.splits)
    read_all(reader, PollLimits(max_records=50))
    assert threading.active_count() == before


def test_it_declares_a_versioned_capability_and_no_durable_source_events(managed):
    capability = managed.capability
    assert capability.runtime_protocol_version == 1 and capability.bounded_poll
    assert capability.wakeup and capability.attempt_fencing
    assert not capability.source_events  # no durable custom events without a serializer
    assert len(capability.digest) == 16
