"""Where a managed enumerator's splits come from: a discovery hands new splits on, only on the
coordinator loop, and remembers the ones it handed on (checkpointed with the enumerator, so a
restored enumerator finds only what is new since its cut).

What a discovery remembers is bounded: a source whose splits are known when it starts keeps
their ids (FixedSplits); one that lists a directory keeps a window of recent arrivals
(``engine.sourceruntime.arrivals``), bounded by its arrival rate, not by the files ever seen.
Either form is checkpointed under a version key (``knownVersion``) that a restore checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from engine.sourceruntime.arrivals import KNOWN_VERSION, VERSION_KEY, check_known_version
from engine.sourceruntime.coordinator import CoordinatorEventLoop

#: What a restore takes: a discovery's snapshot, the earlier unversioned list of split ids, or
#: nothing (the checkpoint had no enumerator state).
KnownState = dict | list | None


class Discovery:
    """Splits handed on once each; ``complete`` once no split will ever come again."""

    def __init__(self, loop: CoordinatorEventLoop, on_new: Callable[[list[dict]], None]) -> None:
        self.loop, self.on_new = loop, on_new
        self.complete = False

    def start(self) -> None:
        raise NotImplementedError

    def snapshot(self) -> dict:
        """What it remembers, versioned: the enumerator checkpoints it."""
        raise NotImplementedError

    def restore(self, state: KnownState, handed_on: Iterable[str] = ()) -> None:
        """The cut's snapshot, and ``handed_on``: the splits the readers hold as of the same
        checkpoint (a reader may have taken a split handed on after the enumerator's cut)."""
        raise NotImplementedError

    def metrics(self) -> dict:
        """Counts for the enumerator's report (never ids or paths)."""
        raise NotImplementedError


class FixedSplits(Discovery):
    """A source whose splits are known when it starts (FakeSource): one hand-on, complete. It
    remembers their ids: as many as the source has."""

    def __init__(
        self,
        loop: CoordinatorEventLoop,
        on_new: Callable[[list[dict]], None],
        splits: list[dict],
    ) -> None:
        super().__init__(loop, on_new)
        self.splits = splits
        self.known: set[str] = set()

    def start(self) -> None:
        def found() -> None:
            self.complete = True  # before the hand-on: the enumerator may end the input there
            self.hand_on(self.splits)

        self.loop.post(found)

    def hand_on(self, splits: list[dict]) -> None:
        """On the loop: the splits not handed on before go to the enumerator."""
        new = [s for s in splits if s["splitId"] not in self.known]
        self.known.update(s["splitId"] for s in new)
        if new:
            self.on_new(new)

    def snapshot(self) -> dict:
        return {VERSION_KEY: KNOWN_VERSION, "splits": sorted(self.known)}

    def restore(self, state: KnownState, handed_on: Iterable[str] = ()) -> None:
        if isinstance(state, dict):
            check_known_version(state)
            state = state["splits"]
        self.known = set(state or ()) | set(handed_on)

    def metrics(self) -> dict:
        return {"known": len(self.known)}
