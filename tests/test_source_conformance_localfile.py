"""LocalFile's managed reader passes the managed Source conformance suite, and its discovery
finds new files on the coordinator's async workers, applying them only on the loop."""

from __future__ import annotations

import threading

import pytest

from engine.connectors.localfile_managed import CAPABILITY, FileDiscovery, ManagedLocalFileReader
from engine.sourceruntime.coordinator import CoordinatorEventLoop, SharedWorkerPool
from engine.states import JobMode
from tests.localfilekit import source_in
from tests.source_conformance import *  # noqa: F403 - the suite's tests run for this connector
from tests.source_conformance import Subject

ROWS = 30


def write(directory, name: str, start: int) -> None:
    (directory / name).write_text("".join(f"{start + i}\n" for i in range(ROWS)))


@pytest.fixture
def managed(tmp_path):
    for n, name in enumerate(("a.csv", "b.csv", "c.csv")):
        write(tmp_path, name, n * ROWS)
    source = source_in(tmp_path, fields="id = int")
    return Subject(
        make=lambda: ManagedLocalFileReader(source, JobMode.BATCH),
        splits=source.create_splits("BATCH"),
        rows_per_split=ROWS,
        capability=CAPABILITY,
    )


def test_discovery_scans_on_the_pool_and_hands_on_each_new_file_once(tmp_path):
    write(tmp_path, "a.csv", 0)
    woken = threading.Event()
    pool = SharedWorkerPool(2)
    clock = [0.0]
    loop = CoordinatorEventLoop(pool, clock=lambda: clock[0], wakeup=woken.set)
    found: list[list[str]] = []
    discovery = FileDiscovery(
        source_in(tmp_path, fields="id = int"),
        loop,
        1.0,
        lambda s: found.append([x["relativePath"] for x in s]),
    )

    def settle():
        """Run the loop until the scan in flight has come back."""
        for _ in range(100):
            woken.clear()
            while loop.step():
                pass
            if not loop.in_flight:
                return
            assert woken.wait(5), "the scan never came back"
        raise AssertionError("discovery never settled")

    discovery.start()
    settle()
    assert found == [["a.csv"]]
    write(tmp_path, "b.csv", 100)
    write(tmp_path, ".hidden", 0)
    clock[0] += 1.0
    settle()
    assert found == [["a.csv"], ["b.csv"]]
    clock[0] += 1.0
    settle()
    assert len(found) == 2  # nothing new: nothing handed on
    restored = FileDiscovery(source_in(tmp_path, fields="id = int"), loop, 1.0, found.append)
    restored.restore(discovery.snapshot())
    assert [item[0] for item in restored.snapshot()["items"]] == ["a.csv", "b.csv"]
    pool.executor.shutdown()


def test_a_streaming_reader_reads_files_added_after_it_started(tmp_path):
    write(tmp_path, "a.csv", 0)
    source = source_in(tmp_path, fields="id = int")
    reader = ManagedLocalFileReader(source, JobMode.STREAMING)
    reader.add_splits(source.create_splits("STREAMING"))
    rows = read_all(reader)  # noqa: F405 - from the suite
    write(tmp_path, "b.csv", ROWS)
    reader.add_splits([s for s in source.create_splits("STREAMING") if s["path"].endswith("b.csv")])
    rows += read_all(reader)  # noqa: F405
    assert sorted(r[0] for r in rows) == list(range(2 * ROWS))
