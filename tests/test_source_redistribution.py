"""A rescale's redistribution of Lane A state (engine.sourceruntime.redistribution), in process:

- any split set held by any number of old readers, dealt to any number of new readers: every
  split held by exactly one new reader, with its description and offset, and the counts
  balanced; the new metadata passes a restore's version checks and starts without lineage or
  watermarks, the old readers' recent assignments all on new reader 0;
- a split two old readers hold, an unknown state key, or readers whose schemas differ are
  refused, never dealt;
- the enumerator's cut reconciled with the old readers' metadata: proven assignments leave the
  tracker, unproven ones return to the pending splits, recent ones are not pending, and no
  entry names a reader index;
- the sinks of removed reader indexes each go to exactly one new reader, also after a second
  rescale.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sourceruntime.capability import (
    MANAGED_LANE_VERSION,
    RUNTIME_METADATA_VERSION,
    check_snapshot_versions,
)
from engine.sourceruntime.envelope import PROTOCOL_VERSION
from engine.sourceruntime.redistribution import (
    NotRedistributable,
    adopted_writers,
    owners,
    reconcile_enumerator,
    redistribute,
)
from engine.sourceruntime.split_offsets import SplitOffsets
from engine.sourceruntime.tracker import AssignmentTracker


def metadata(lineage: list[int], recent: list | None = None, version: int = 2) -> dict:
    return {
        "metadataVersion": RUNTIME_METADATA_VERSION,
        "commandProtocolVersion": PROTOCOL_VERSION,
        "managedLaneVersion": MANAGED_LANE_VERSION,
        "connectorStateVersion": version,
        "readerAttemptLineage": lineage,
        "appliedSenderWatermarks": {"3": {"upto": 7, "above": []}},
        "recentAssignments": recent or [],
        "noMoreSplitsGeneration": 0,
        "capabilityDigest": "digest",
    }


def snapshot(splits: dict[str, int], lineage: list[int], recent: list | None = None) -> dict:
    return {
        "state": {
            "splits": [{"splitId": s, "path": f"in/{s}.csv"} for s in sorted(splits)],
            "offsets": dict(splits),
        },
        "metadata": metadata(lineage, recent),
    }


@st.composite
def holdings(draw) -> tuple[dict[int, dict | None], dict[str, int]]:
    """Old readers (1 to 6), some without a snapshot, holding distinct splits with offsets."""
    old = draw(st.integers(1, 6))
    ids = draw(st.sets(st.text("abcdef0123456789", min_size=1, max_size=6), max_size=40))
    offsets = {s: draw(st.integers(0, 10**9)) for s in sorted(ids)}
    readers: dict[int, dict[str, int]] = {i: {} for i in range(old)}
    for split_id, offset in offsets.items():
        readers[draw(st.integers(0, old - 1))][split_id] = offset
    bare = draw(st.sets(st.integers(0, old - 1)))
    snaps = {
        i: None if i in bare and not held else snapshot(held, [i + 1])
        for i, held in readers.items()
    }
    return snaps, offsets


@settings(max_examples=300, deadline=None)
@given(holdings(), st.integers(1, 9))
def test_every_split_goes_to_exactly_one_new_reader_with_its_offset(case, parallelism):
    old, offsets = case
    new = redistribute(old, parallelism)
    assert sorted(new) == list(range(parallelism))
    if all(s is None for s in old.values()):
        assert set(new.values()) == {None}
        return
    seen: dict[str, int] = {}
    for index, snap in new.items():
        state = snap["state"]
        assert [s["splitId"] for s in state["splits"]] == sorted(state["offsets"])
        for split in state["splits"]:
            assert split["splitId"] not in seen, "a split held twice"
            seen[split["splitId"]] = index
            assert split["path"] == f"in/{split['splitId']}.csv"
        assert state["offsets"] == {s: offsets[s] for s in state["offsets"]}
        meta = snap["metadata"]
        check_snapshot_versions(meta, PROTOCOL_VERSION, 2)  # a restore reads it
        assert meta["readerAttemptLineage"] == [] and meta["appliedSenderWatermarks"] == {}
        reader = SplitOffsets()
        reader.restore(state)
        assert reader.offsets == state["offsets"]
    assert set(seen) == set(offsets)  # none lost
    counts = [len(snap["state"]["splits"]) for snap in new.values()]
    assert max(counts) - min(counts) <= 1  # balanced
    # by split id, not by old reader: the same splits held otherwise deal the same way
    assert seen == owners(set(offsets), parallelism)


def test_recent_assignments_all_go_to_new_reader_0():
    old = {
        0: snapshot({"a": 1}, [1], recent=[[3, 4, ["a", "gone"]]]),
        1: snapshot({"b": 2}, [1], recent=[[3, 5, ["b"]]]),
    }
    new = redistribute(old, 3)
    assert new[0]["metadata"]["recentAssignments"] == [[3, 4, ["a", "gone"]], [3, 5, ["b"]]]
    assert new[1]["metadata"]["recentAssignments"] == new[2]["metadata"]["recentAssignments"] == []


def test_what_cannot_be_dealt_by_split_id_is_refused():
    with pytest.raises(NotRedistributable, match="held by readers 0 and 1"):
        redistribute({0: snapshot({"a": 1}, [1]), 1: snapshot({"a": 5}, [1])}, 2)
    odd = snapshot({"a": 1}, [1])
    odd["state"]["cursor"] = 3
    with pytest.raises(NotRedistributable, match="cursor"):
        redistribute({0: odd}, 2)
    changed = snapshot({"b": 1}, [1])
    changed["schema"] = [["id", "bigint"]]
    with pytest.raises(NotRedistributable, match="schema"):
        redistribute({0: snapshot({"a": 1}, [1]), 1: changed}, 2)
    same = {0: {**snapshot({"a": 1}, [1]), "schema": [["id", "int"]]}}
    assert redistribute(same, 2)[1]["schema"] == [["id", "int"]]


def test_the_enumerator_cut_keeps_no_reader_index():
    tracker = AssignmentTracker()
    # reader 0 attempt 1 applied sequences up to 7 of sender 3: "p" (sequence 5) is proven
    tracker.dispatch("p", 10, 0, 1, 3, 5)
    tracker.applied("p", 0, 1)
    # reader 1's "u" (sequence 9) is not proven by its metadata: it returns to the enumerator
    tracker.dispatch("u", 10, 1, 1, 3, 9)
    own = {
        "enumeratorStateVersion": 1,
        "tracker": tracker.to_json(),
        "pending": ["q", "r"],
        "splits": {s: {"splitId": s} for s in ("p", "u", "q", "r", "old")},
        "known": {"files": ["x"]},
        "epoch": 3,
    }
    old = {0: metadata([1]), 1: metadata([1], recent=[[3, 6, ["r"]]])}
    cut = reconcile_enumerator(own, old)
    restored = AssignmentTracker.from_json(cut["tracker"])
    assert all(e.reader is None for e in restored.entries.values())
    assert "p" not in restored.entries  # the reader's for good
    assert cut["pending"] == ["q", "u"]  # "r" a reader applied: not pending
    assert set(cut["splits"]) == {"q", "u"}
    assert cut["known"] == own["known"] and cut["epoch"] == 3


def test_removed_readers_sinks_each_go_to_one_new_reader():
    assert adopted_writers({0: [], 1: [], 2: []}, 3, 1) == {0: [1, 2]}
    assert adopted_writers({0: [], 1: []}, 2, 3) == {0: [], 1: [], 2: []}
    assert adopted_writers({i: [] for i in range(5)}, 5, 2) == {0: [2, 4], 1: [3]}
    # 3 -> 1, then 1 -> 2 before a checkpoint of the new readers completed: index 1 runs
    # again (it settles its own sinks), index 2 is still settled by someone
    assert adopted_writers({0: [1, 2]}, 1, 2) == {0: [2], 1: []}
