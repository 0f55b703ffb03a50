"""A reader's snapshot records the versions of what wrote it (runtime metadata, command
protocol, managed lane); a runtime that cannot read one of them refuses the restore before
anything runs, naming the key, instead of reading it as if it were its own."""

from __future__ import annotations

import pytest

from engine.sourceruntime.capability import (
    MANAGED_LANE_VERSION,
    RUNTIME_METADATA_VERSION,
    LaneMismatch,
    check_snapshot_versions,
)
from engine.sourceruntime.envelope import PROTOCOL_VERSION
from engine.sourceruntime.lifecycle import Life
from engine.sourceruntime.reader import Snapshot
from tests.sourcekit import ManagedPipeline


def taken_snapshot() -> Snapshot:
    """A real snapshot of a managed FakeSource reader, taken at a barrier."""
    pipeline = ManagedPipeline()
    pipeline.assign()
    pipeline.deliver()
    pipeline.run_reader()
    pipeline.barrier()
    pipeline.deliver()
    pipeline.run_reader()
    assert pipeline.completed is not None, "no checkpoint completed"
    return pipeline.completed[1]


def test_a_snapshot_records_the_versions_it_was_written_with():
    metadata = taken_snapshot().metadata
    assert metadata["metadataVersion"] == RUNTIME_METADATA_VERSION
    assert metadata["commandProtocolVersion"] == PROTOCOL_VERSION
    assert metadata["managedLaneVersion"] == MANAGED_LANE_VERSION
    check_snapshot_versions(metadata, PROTOCOL_VERSION)  # ours: readable


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("metadataVersion", RUNTIME_METADATA_VERSION + 1),
        ("commandProtocolVersion", PROTOCOL_VERSION + 1),
        ("managedLaneVersion", MANAGED_LANE_VERSION + 1),
        ("metadataVersion", None),
        ("managedLaneVersion", "1"),
        ("commandProtocolVersion", 0),
    ],
)
def test_a_version_this_runtime_cannot_read_refuses_the_restore_before_anything_runs(key, value):
    snapshot = taken_snapshot()
    metadata = dict(snapshot.metadata)
    if value is None:
        del metadata[key]
    else:
        metadata[key] = value
    pipeline = ManagedPipeline()
    with pytest.raises(LaneMismatch, match=rf"{key} .*restore with a compatible version"):
        pipeline._start_reader(Snapshot(snapshot.checkpoint, snapshot.state, metadata))
    assert pipeline.loop.life.state not in (Life.RESTORING, Life.RUNNING)
