"""The runtime's latency metrics, deterministically: the bounded histogram (buckets, percentiles,
merging many task groups' reports), a barrier's wait in the reader mailbox as the reader event
loop records it, and a command's publish-to-admission time as the enumerator records it."""

from __future__ import annotations

from engine.sourceruntime import CommandKind, MailboxLimits, ReaderMailbox, WorkerBudget
from engine.sourceruntime.choices import AdmissionStatus
from engine.sourceruntime.discovery import FixedSplits
from engine.sourceruntime.latency import (
    BUCKETS,
    LatencyHistogram,
    bucket_of,
    merged,
    percentile_ms,
    upper_ms,
)
from engine.sourceruntime.limits import PollLimits
from engine.sourceruntime.reader import ReaderEventLoop
from tests.source_conformance import envelope_for
from tests.test_source_enumerator_task import enumerator, run_loop, splits
from tests.test_source_reader_loop import Clock, CountingReader


def test_a_latency_falls_in_the_bucket_whose_bound_is_the_first_at_or_above_it():
    for seconds in (2e-6, 1e-4, 0.0037, 0.5, 3.0):
        bucket = bucket_of(seconds)
        assert upper_ms(bucket - 1) < seconds * 1000 <= upper_ms(bucket) * (1 + 1e-9)
    assert bucket_of(0.0) == 0
    assert bucket_of(10**6) == BUCKETS - 1  # beyond the last bound: the last bucket


def test_percentiles_are_bucket_bounds_never_above_the_largest_and_reports_merge_exactly():
    histogram = LatencyHistogram()
    for _ in range(98):
        histogram.record(0.001)
    histogram.record(0.049)
    histogram.record(0.050)
    report = histogram.to_json()
    assert report["count"] == 100
    assert report["p50Ms"] == round(upper_ms(bucket_of(0.001)), 3)  # 1.024 ms
    assert report["p99Ms"] == 50.0 < upper_ms(bucket_of(0.050))  # capped at the largest
    assert report["maxMs"] == 50.0
    assert len(report["buckets"]) == 2  # only non-empty buckets are reported
    other = LatencyHistogram()
    other.record(40.0)  # past the last bound: the largest is the answer
    buckets, largest = merged([report, other.to_json(), None])
    assert sum(buckets.values()) == 101 and largest == 40_000.0
    assert percentile_ms(buckets, 1.0, largest) == 40_000.0
    assert percentile_ms({}, 0.99) == 0.0


def test_the_reader_loop_records_a_barrier_s_wait_from_admission_to_application():
    clock = Clock()
    box = ReaderMailbox(1, "1/1", 1, MailboxLimits(), WorkerBudget(10**9), clock=clock)
    snapshots = []
    loop = ReaderEventLoop(
        box, CountingReader(10), PollLimits(), list, snapshots.append, "digest", clock=clock
    )
    loop.start()
    box.admit(envelope_for(box, CommandKind.ASSIGN_SPLITS, {"splits": ["a"]}))
    box.admit(envelope_for(box, CommandKind.CHECKPOINT, {"checkpoint": 1}))
    clock.advance(0.004)  # both wait 4 ms; only the barrier is a control whose wait counts
    loop.step()
    assert loop.metrics.control_latency.count == 0
    loop.step()
    assert [s.checkpoint for s in snapshots] == [1]
    report = loop.metrics.control_latency.to_json()
    assert report["count"] == 1 and report["maxMs"] == 4.0
    assert report["buckets"] == {str(bucket_of(0.004)): 1}


def test_the_enumerator_records_publish_to_admission_of_the_publish_that_was_admitted():
    task, outbox = enumerator()
    task.discovery = FixedSplits(task.loop, task._on_new, splits(3))
    task.discovery.start()
    run_loop(task)
    published = outbox.sent[:3]
    sent_at = [args[4][4] for _, args, _ in published]  # the publish's time, in its reply
    assert all(isinstance(t, float) for t in sent_at)
    first, second, third = outbox.envelopes()[:3]

    def answer(envelope, status, sent, admitted_after):
        task._on_ack(
            {
                "commandId": envelope.commandId,
                "ack": {"status": status.value, "retryAfterMillis": 10},
                "sentAt": sent,
                "admittedAt": sent + admitted_after,
            }
        )

    answer(first, AdmissionStatus.RETRY_LATER, sent_at[0], 0.001)  # not admitted: not recorded
    assert task.admission_latency.count == 0
    answer(first, AdmissionStatus.ACCEPTED, sent_at[0], 0.002)
    # Published again since (its answer was slow): the answer names the publish admitted.
    answer(second, AdmissionStatus.ACCEPTED, sent_at[1] - 1.5, 1.5)
    answer(third, AdmissionStatus.DUPLICATE, sent_at[2], 0.003)  # admitted by an answer lost
    task._on_ack({"commandId": "gone", "ack": {"status": "ACCEPTED"}})  # an older handler's
    report = task.admission_latency.to_json()
    assert report["count"] == 2
    assert report["buckets"] == {str(bucket_of(0.002)): 1, str(bucket_of(1.5)): 1}
