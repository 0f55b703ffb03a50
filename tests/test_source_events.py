"""SOURCE_EVENTs from readers to their enumerator, in process: a LocalFile reader's backlog (files
held, bytes left), sent by its link at most every interval and only when changed, and the
enumerator assigning new files to the reader with the smallest backlog reported (ties and readers
without a report round-robin; a stale attempt's or epoch's event ignored and counted)."""

from __future__ import annotations

import json
import os

from engine.connectors.batches import limits
from engine.connectors.localfile_backlog import FileBacklog
from engine.connectors.localfile_managed import Found, ManagedLocalFileReader, split_for
from engine.member.enumerator_link import EVENT_REFRESH, SOURCE_EVENT, EnumeratorLink
from engine.protocol import TASK_SOURCE_ACK
from engine.sourceruntime.choices import CommandKind, PollStatus
from engine.sourceruntime.discovery import FixedSplits
from engine.states import JobMode
from tests.localfilekit import source_in
from tests.source_conformance import turn
from tests.test_source_enumerator_task import (
    EPOCH,
    RecordingOutbox,
    answer,
    enumerator,
    register,
    run_loop,
)


def event(task, index: int, files: int, size: int, attempt=EPOCH, epoch=EPOCH) -> None:
    """Reader ``index``'s backlog report, as its link sends it."""
    backlog = {"backlog": {"files": files, "bytes": size}}
    message = {"kind": SOURCE_EVENT, "reader": index, "attempt": attempt, "epoch": epoch}
    task._on_ack({**message, "event": backlog})


def assigned_to(task, outbox, n: int, size: int = 1000) -> list[int]:
    """``n`` new files of ``size`` bytes found: the reader each one is assigned to, in order."""
    found = [{"splitId": f"file:f{i}", "path": f"/f{i}", "bytes": size} for i in range(n)]
    task.discovery = FixedSplits(task.loop, task._on_new, found)
    task.discovery.start()
    run_loop(task)
    sent = [e for e in outbox.envelopes() if e.kind == CommandKind.ASSIGN_SPLITS]
    queues = {f"worker-{i}": i for i in range(len(task.expected))}
    readers = [queues[q.rsplit(".", 1)[-1]] for t, a, q in outbox.sent if t != TASK_SOURCE_ACK]
    assert len(readers) == len(sent) == n
    return readers


def test_new_files_go_to_the_reader_with_the_smallest_backlog():
    task, outbox = enumerator(readers=2, batch=False)
    event(task, 0, files=1, size=10**9)  # a very large file held
    event(task, 1, files=0, size=0)
    readers = assigned_to(task, outbox, 10)
    assert readers == [1] * 10  # round-robin would split them 5 and 5
    assert task.backlogs.metrics()["byBacklog"] == 10  # each time, the turn was reader 0's
    assert task.backlogs.view(1) == (10 * 1000, 10)  # assigned since its report


def test_a_reader_at_its_bound_gets_nothing_until_it_reports_fewer():
    """A backlog waits in the enumerator's pending splits, not in a reader's state."""
    task, outbox = enumerator(readers=2, batch=False)
    task.backlogs.max_files = 3
    event(task, 0, files=3, size=300)  # at its bound
    event(task, 1, files=1, size=100)
    found = [{"splitId": f"file:f{i}", "path": f"/f{i}", "bytes": 100} for i in range(7)]
    task.discovery = FixedSplits(task.loop, task._on_new, found)
    task.discovery.start()
    run_loop(task)

    def readers() -> list[str]:
        return [q.rsplit(".", 1)[-1] for t, a, q in outbox.sent if t != TASK_SOURCE_ACK]

    assert readers() == ["worker-1", "worker-1"]  # up to its bound of 3
    assert len(task.pending) == 5 and task.backlogs.metrics()["full"] >= 1
    event(task, 1, files=3, size=300)  # still at its bound: nothing moves
    assert len(readers()) == 2
    event(task, 0, files=0, size=0)  # reader 0 read its files: room for 3
    assert readers()[2:] == ["worker-0"] * 3 and len(task.pending) == 2


def test_a_reader_that_never_reports_is_not_bounded():
    task, outbox = enumerator(readers=2, batch=False)
    task.backlogs.max_files = 1
    assert assigned_to(task, outbox, 6) == [0, 1, 0, 1, 0, 1]


def test_ties_and_readers_without_a_report_go_round_robin():
    task, outbox = enumerator(readers=2, batch=False)
    assert assigned_to(task, outbox, 4) == [0, 1, 0, 1]  # no report at all

    task, outbox = enumerator(readers=2, batch=False)
    event(task, 1, files=0, size=0)  # one reader's report only
    assert assigned_to(task, outbox, 4) == [0, 1, 0, 1]

    task, outbox = enumerator(readers=2, batch=False)
    event(task, 0, files=0, size=0)
    event(task, 1, files=0, size=0)  # equal: each file's bytes then tip the balance in turn
    assert assigned_to(task, outbox, 4) == [0, 1, 0, 1]


def test_an_event_of_a_stale_attempt_or_epoch_is_ignored_and_counted():
    task, outbox = enumerator(readers=2, batch=False)
    event(task, 0, files=1, size=10**9, attempt=EPOCH - 1)  # an older attempt's
    event(task, 0, files=1, size=10**9, epoch=EPOCH - 1)  # sent to an older enumerator
    event(task, 1, files=0, size=0)
    event(task, 7, files=0, size=0)  # not a registered reader
    task._on_ack({"kind": SOURCE_EVENT, "reader": 1, "attempt": EPOCH, "epoch": EPOCH})
    assert task.backlogs.metrics() == {
        "received": 1,
        "stale": 3,
        "invalid": 1,
        "byBacklog": 0,
        "full": 0,
    }
    assert assigned_to(task, outbox, 2) == [0, 1]  # reader 0 has no report: round-robin


def test_a_new_attempt_registering_drops_the_older_attempts_report():
    task, outbox = enumerator(readers=2, batch=False)
    event(task, 0, files=1, size=10**9)
    event(task, 1, files=0, size=0)
    answer(task, register(task, outbox, 0, attempt=EPOCH + 1))  # reader 0 restored alone
    outbox.sent.clear()
    assert 0 not in task.backlogs.reported
    assert assigned_to(task, outbox, 2) == [0, 1]


def confirmed_link(source) -> tuple[EnumeratorLink, RecordingOutbox]:
    outbox = RecordingOutbox()
    link = EnumeratorLink(outbox, 1, 4, [10, EPOCH, "uuid-e", "worker-e"])
    link.events_from(source)
    link.event_every = 0.2
    link.register(101, "uuid-1", "worker-1", {})
    return link, outbox


def events(outbox: RecordingOutbox) -> list[dict]:
    return [
        a[3] for t, a, _ in outbox.sent if t == TASK_SOURCE_ACK and a[3]["kind"] == "SOURCE_EVENT"
    ]


def test_the_link_sends_events_once_confirmed_at_most_every_interval_and_when_changed():
    backlog = {"backlog": {"files": 1, "bytes": 500}}
    asked = []
    link, outbox = confirmed_link(lambda: asked.append(1) or json.loads(json.dumps(backlog)))
    link.tick(now=100.0)
    assert events(outbox) == [] and asked == []  # not confirmed yet: not even asked
    link.confirm({"enumerator": [10, EPOCH, "uuid-e", "worker-e"]})
    for now in (100.0, 100.05, 100.1, 100.15):  # every step of the reader's thread
        link.tick(now=now)
    assert len(asked) == 1  # at most every interval
    assert events(outbox) == [
        {"kind": SOURCE_EVENT, "reader": 1, "attempt": 4, "epoch": EPOCH, "event": backlog}
    ]
    link.tick(now=100.2)  # unchanged: coalesced into the one sent
    assert len(asked) == 2 and len(events(outbox)) == 1
    backlog["backlog"]["bytes"] = 200
    link.tick(now=100.3)  # changed, not due yet
    link.tick(now=100.4)
    assert [e["event"]["backlog"]["bytes"] for e in events(outbox)] == [500, 200]
    link.tick(now=100.4 + EVENT_REFRESH)  # unchanged for long: sent again (one may be lost)
    assert len(events(outbox)) == 3 and link.events_sent == 3
    pairs = zip(outbox.sent, outbox.batchable, strict=True)
    sent = [(a[3]["kind"], batch) for (_, a, _), batch in pairs]
    # events share messages for the enumerator's queue, and so does the registration
    assert [batch for kind, batch in sent if kind == SOURCE_EVENT] == [True] * 3
    assert [batch for kind, batch in sent if kind != SOURCE_EVENT] == [True]


def test_a_backlog_report_holds_until_its_files_change_or_its_bytes_move_a_tenth():
    """Bytes left change with every poll turn while a reader reads: the report (and so the
    link's event, sent only when it changed) holds until the change is worth telling."""
    backlog = FileBacklog()
    splits = {"a": {"bytes": 1000}, "b": {"bytes": 1000}}
    backlog.read_bytes, backlog.read_records = 10, 1  # 10 bytes a record
    reports = []
    for read in (0, 10, 20, 21, 30, 38):  # records of a read
        reports.append(backlog.event(splits, {"a": read})["backlog"])
    assert [r["bytes"] for r in reports] == [2000, 2000, 2000, 1790, 1790, 1790]
    assert backlog.last == {"files": 2, "bytes": 1620}  # the metrics say what it is now
    del splits["b"]  # a file less: reported at once, however few bytes it moves
    assert backlog.event(splits, {"a": 38})["backlog"] == {"files": 1, "bytes": 620}
    splits["c"] = {"bytes": 0}
    assert backlog.event(splits, {"a": 38})["backlog"] == {"files": 2, "bytes": 620}


def test_a_localfile_readers_backlog_is_its_files_and_the_bytes_left(tmp_path):
    for name, rows in (("a", 200), ("b", 3 * limits()[0])):  # b: several blocks
        (tmp_path / f"{name}.csv").write_text("".join(f"{i},{name}\n" for i in range(rows)))
    size, size_b = (os.stat(tmp_path / f"{n}.csv").st_size for n in "ab")
    source = source_in(tmp_path)
    reader = ManagedLocalFileReader(source, JobMode.STREAMING)
    assert reader.source_event() == {"backlog": {"files": 0, "bytes": 0}}
    a = tmp_path / "a.csv"
    stat = a.stat()
    reader.add_splits([split_for(Found("a.csv", str(a), stat.st_ctime_ns, stat.st_ino, size))])
    described = [s for s in source.create_splits(JobMode.STREAMING) if "b.csv" in s["path"]]
    reader.add_splits(described)  # a description without its size: the reader stats the file
    assert reader.source_event() == {"backlog": {"files": 2, "bytes": size + size_b}}
    while turn(reader)[0] == PollStatus.MORE_AVAILABLE and len(reader.splits) == 2:
        pass
    assert list(reader.splits) == [described[0]["splitId"]]  # a read: its bytes per record
    assert 0 < reader.offsets[described[0]["splitId"]] < 3 * limits()[0]  # b partly read
    left = reader.source_event()["backlog"]
    assert left["files"] == 1 and 0 < left["bytes"] < size_b  # what b has left, estimated
    metrics = reader.metrics()
    assert metrics["splitsAdded"] == 2 and metrics["backlogFiles"] == 1
    assert metrics["backlogBytes"] == left["bytes"]
