"""FakeSource's managed reader passes the managed Source conformance suite."""

from __future__ import annotations

import pytest

from engine.connectors.fake import FakeSource
from engine.connectors.fake_managed import CAPABILITY, ManagedFakeReader
from engine.jobs.planner import plan_job
from tests.source_conformance import *  # noqa: F403 - the suite's tests run for this connector
from tests.source_conformance import Subject


@pytest.fixture
def managed():
    plan = plan_job("source { FakeSource { row.num = 40, split.num = 3 } }\nsink { Blackhole {} }")
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


def test_a_paced_split_never_blocks_a_turn_and_says_when_it_has_more():
    """rows.per-second: a turn takes what is due and returns; with nothing due the reader says
    when (``retry_at``), and the event loop polls again then without any command."""
    from engine.sourceruntime.limits import MailboxLimits, PollLimits
    from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
    from engine.sourceruntime.reader import ReaderEventLoop

    now = [100.0]
    source = source_of("row.num = 30, split.num = 1, rows.per-second = 10")
    reader = ManagedFakeReader(source, clock=lambda: now[0])
    mailbox = ReaderMailbox(1, "1/0", 1, MailboxLimits(), WorkerBudget(10**9))
    out: list = []
    loop = ReaderEventLoop(
        mailbox, reader, PollLimits(), out.extend, lambda s: None, "", clock=lambda: now[0]
    )
    loop.start()
    reader.add_splits(source.create_splits("BATCH"))
    loop.step()
    assert len(out) == 1 and reader.retry_at == pytest.approx(100.1)  # one row due at start
    assert not loop.step() and loop.idle_for(1.0) == pytest.approx(0.1)
    now[0] = 100.55
    loop.step()
    assert len(out) == 6  # rows due by 0.55 s: 0.0, 0.1, ... 0.5
    now[0] = 104.0
    reader.notify_no_more_splits()
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
