"""The design's eleven fault-injection points, each a test: a Lane A pipeline (enumerator with
its tracker, a reader's mailbox and event loop, a sink committing per checkpoint) crashes, loses
or has refused the step at that point once, recovers as the engine does, and still commits every
row exactly once."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=120, deadline=None)
@given(
    faults=st.dictionaries(
        st.sampled_from(POINTS), st.sets(st.integers(1, 4), min_size=1, max_size=2), max_size=3
    ),
    abort_every=st.sampled_from([None, 1, 2, 3]),
    checkpoints=st.booleans(),
    splits=st.integers(1, 4),
    rows=st.integers(1, 30),
)
def test_any_schedule_of_faults_and_failed_checkpoints_commits_every_row_once(
    faults, abort_every, checkpoints, splits, rows
):
    """Model-based: duplicate and lost deliveries, lost acknowledgements, refused capacity,
    reader and coordinator failovers at any of the points, checkpoints that abort (every one
    of them, sustained), or none at all until the end; no row lost, none committed twice."""
    pipeline = ManagedPipeline(
        splits=splits, rows=rows, faults=faults, abort_every=abort_every, checkpoints=checkpoints
    )
    committed = pipeline.run(rounds=2000)
    assert Counter(committed) == Counter(pipeline.expected())
