"""The connectors that run in the managed lane (Lane A): for each, its managed reader and where
its enumerator's splits come from. A plugin declares ``managed_capability`` on its class (what
planning looks at); the runtime pieces live beside it, looked up here by plugin name."""

from __future__ import annotations

from collections.abc import Callable

from engine.connectors.fake import FakeSource
from engine.connectors.fake_managed import ManagedFakeReader
from engine.connectors.localfile import LocalFileSource
from engine.connectors.localfile_managed import FileDiscovery, ManagedLocalFileReader
from engine.sourceruntime.coordinator import CoordinatorEventLoop
from engine.sourceruntime.discovery import Discovery, FixedSplits
from engine.sourceruntime.reader import ManagedReader
from engine.states import JobMode

OnNew = Callable[[list[dict]], None]
Room = Callable[[], int]


def _fake_discovery(
    source: FakeSource, mode: str, loop: CoordinatorEventLoop, on_new: OnNew, room: Room
):
    """Its splits are the source's own, all known at once (``room`` does not bound them)."""
    return FixedSplits(loop, on_new, source.create_splits(mode))


def _file_discovery(
    source: LocalFileSource, mode: str, loop: CoordinatorEventLoop, on_new: OnNew, room: Room
) -> Discovery:
    """New files as splits every ``file.discovery.interval`` ms in a STREAMING job; else one
    scan, after which the discovery is complete (scans again while ``room`` left files out)."""
    interval = source.config.get("file.discovery.interval")
    streaming = mode == JobMode.STREAMING and interval
    return FileDiscovery(source, loop, interval / 1000 if streaming else None, on_new, room)


RUNTIMES: dict[str, tuple[Callable[..., ManagedReader], Callable[..., Discovery]]] = {
    FakeSource.name: (ManagedFakeReader, _fake_discovery),
    LocalFileSource.name: (ManagedLocalFileReader, _file_discovery),
}


def reader_for(source, mode: str) -> ManagedReader:
    return RUNTIMES[source.name][0](source, mode)


def discovery_for(
    source, mode: str, loop: CoordinatorEventLoop, on_new: OnNew, room: Room
) -> Discovery:
    """``room``: how many more new splits the enumerator takes now (a listing source's bound
    on its pending splits)."""
    return RUNTIMES[source.name][1](source, mode, loop, on_new, room)
