"""The connector state a managed reader snapshots, and the enumerator's checkpointed state, each
carry a version; a restore refuses a newer one, or none, before anything runs, naming the key.
Runtime metadata of version 1 predates the connector state's version: it reads as version 1."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.connectors.fake_managed import ManagedFakeReader
from engine.connectors.localfile_managed import ManagedLocalFileReader
from engine.sourceruntime.capability import (
    ENUMERATOR_STATE_VERSION,
    LaneMismatch,
    check_enumerator_state,
    check_snapshot_versions,
)
from engine.sourceruntime.envelope import PROTOCOL_VERSION
from engine.sourceruntime.lifecycle import Life
from engine.sourceruntime.reader import Snapshot
from engine.sourceruntime.tracker import AssignmentTracker
from tests.sourcekit import ManagedPipeline
from tests.test_source_enumerator_task import enumerator
from tests.test_source_snapshot_versions import taken_snapshot


def test_each_managed_reader_declares_its_state_version_and_snapshots_record_it():
    assert ManagedFakeReader.STATE_VERSION == 1
    assert ManagedLocalFileReader.STATE_VERSION == 2  # finished files leave its state
    assert taken_snapshot().metadata["connectorStateVersion"] == ManagedFakeReader.STATE_VERSION


@pytest.mark.parametrize(
    ("metadata", "readable"),
    [
        ({"metadataVersion": 2, "connectorStateVersion": 2}, True),
        ({"metadataVersion": 2, "connectorStateVersion": 3}, False),  # newer than the reader's
        ({"metadataVersion": 2}, False),  # missing in a format that has it
        ({"metadataVersion": 2, "connectorStateVersion": "2"}, False),
        ({"metadataVersion": 1}, True),  # written before the key: version 1
    ],
)
def test_a_connector_state_version_the_reader_cannot_read_is_refused(metadata, readable):
    full = {"commandProtocolVersion": PROTOCOL_VERSION, "managedLaneVersion": 1, **metadata}
    if readable:
        check_snapshot_versions(full, PROTOCOL_VERSION, 2)
    else:
        with pytest.raises(LaneMismatch, match=r"connectorStateVersion .*compatible version"):
            check_snapshot_versions(full, PROTOCOL_VERSION, 2)


def test_the_event_loop_refuses_a_newer_connector_state_before_it_runs():
    snapshot = taken_snapshot()
    metadata = {**snapshot.metadata, "connectorStateVersion": 2}  # FakeSource reads 1
    pipeline = ManagedPipeline()
    with pytest.raises(LaneMismatch, match="connectorStateVersion 2"):
        pipeline._start_reader(Snapshot(snapshot.checkpoint, snapshot.state, metadata))
    assert pipeline.loop.life.state not in (Life.RESTORING, Life.RUNNING)


def test_the_enumerator_checkpoints_its_state_version_and_a_restore_checks_it():
    task, _ = enumerator()
    task.discovery = SimpleNamespace(snapshot=lambda: {"knownVersion": 1, "splits": []})
    acked = []
    task.thread.db = lambda what, call, *args: acked.append(args)
    task.group.id, task.thread.attempt = 10, 3
    task._snapshot(5)
    ((checkpoint, group, attempt, state),) = acked
    assert (checkpoint, group, attempt) == (5, 10, 3)
    own = state["managed"]
    assert own["enumeratorStateVersion"] == ENUMERATOR_STATE_VERSION
    check_enumerator_state(own)
    AssignmentTracker.from_json(own["tracker"])
    for version in (None, ENUMERATOR_STATE_VERSION + 1, 0):
        changed = {**own, "enumeratorStateVersion": version}
        if version is None:
            del changed["enumeratorStateVersion"]
        with pytest.raises(LaneMismatch, match=f"enumeratorStateVersion {version!r}"):
            check_enumerator_state(changed)
