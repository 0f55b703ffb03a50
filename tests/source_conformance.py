"""The managed Source conformance suite: what a connector's managed reader must do to run in
Lane A. A connector's test module provides a ``managed`` fixture returning a ``Subject`` (a
factory of fresh readers with the splits they read and the rows each split holds) and imports
these tests. Each check runs the reader under the real event loop where ordering matters."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.reader import PollContext


@dataclass
class Subject:
    make: Callable[[], object]  # a fresh reader
    splits: list[dict]  # what the enumerator would assign
    rows_per_split: int  # rows each split holds (BATCH)
    capability: object  # its ManagedSourceCapability


def turn(reader, limits: PollLimits | None = None, clock=time.monotonic, contexts=None):
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


def test_wakeup_is_idempotent_and_safe_from_other_threads(managed):
    reader = managed.make()
    threads = [threading.Thread(target=reader.wakeup) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    reader.wakeup()
    assert turn(reader)[0] in (PollStatus.NOTHING_AVAILABLE, PollStatus.MORE_AVAILABLE)


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
