"""The design's eleven fault-injection points, each a test: a Lane A pipeline (enumerator with
its tracker, a reader's mailbox and event loop, a sink committing per checkpoint) crashes, loses
or has refused the step at that point once, recovers as the engine does, and still commits every
row exactly once."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.sourcekit import CRASHES, POINTS, ManagedPipeline


def test_without_faults_every_row_is_committed_once():
    pipeline = ManagedPipeline()
    committed = pipeline.run()
    assert Counter(committed) == Counter(pipeline.expected()) and pipeline.recoveries == 0


@pytest.mark.parametrize("point", POINTS)
def test_a_fault_at_each_point_loses_and_duplicates_nothing(point):
    pipeline = ManagedPipeline(fault=point)
    committed = pipeline.run()
    assert pipeline.fired, f"the run never reached {point}"
    assert pipeline.recoveries == (1 if CRASHES[point] in ("reader", "coordinator") else 0)
    assert Counter(committed) == Counter(pipeline.expected())
    assert len(committed) == len(set(committed)) == 4 * 25
