"""LocalFile's managed reader, woken while a poll call finds the end of one file, returns
before it opens another: a wakeup ends the call at the batch boundary."""

from __future__ import annotations

from engine.connectors.localfile_managed import ManagedLocalFileReader
from engine.sourceruntime.choices import PollStatus
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.reader import PollContext
from engine.states import JobMode
from tests.localfilekit import source_in


def test_a_woken_call_opens_no_further_file(tmp_path):
    (tmp_path / "a.csv").write_text("".join(f"{i}\n" for i in range(10)))
    (tmp_path / "b.csv").write_text("".join(f"{i}\n" for i in range(100, 130)))
    source = source_in(tmp_path, fields="id = int")
    reader = ManagedLocalFileReader(source, JobMode.BATCH)
    reader.add_splits(source.create_splits(JobMode.BATCH))
    reader.notify_no_more_splits()
    limits = PollLimits(max_records=20)

    def call(woken: bool = False) -> tuple[PollStatus, list]:
        context = PollContext(limits, lambda: 0.0, 0.0, wake=reader.wake)
        context.wake.woken = woken  # woken as the call starts reading (the loop clears it)
        status = reader.poll(context)
        return status, context.records

    assert call() == (PollStatus.MORE_AVAILABLE, [(i,) for i in range(10)])  # all of a.csv
    assert call()[1] == [(i,) for i in range(100, 120)]  # b.csv's first 20
    assert call()[1] == [(i,) for i in range(120, 130)]  # the rest of its block first
    assert call(woken=True) == (PollStatus.MORE_AVAILABLE, [])  # a.csv ends: b.csv not read
    assert call()[0] == PollStatus.END_OF_INPUT
