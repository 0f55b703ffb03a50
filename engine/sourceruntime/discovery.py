"""Where a managed enumerator's splits come from: a discovery hands new splits on, only on the
coordinator loop, and remembers the ones it handed on (checkpointed with the enumerator, so a
restored enumerator finds only what is new since its cut)."""

from __future__ import annotations

from collections.abc import Callable

from engine.sourceruntime.coordinator import CoordinatorEventLoop


class Discovery:
    """Splits handed on by id, once; ``complete`` once no split will ever come again."""

    def __init__(self, loop: CoordinatorEventLoop, on_new: Callable[[list[dict]], None]) -> None:
        self.loop, self.on_new = loop, on_new
        self.known: set[str] = set()
        self.complete = False

    def start(self) -> None:
        raise NotImplementedError

    def hand_on(self, splits: list[dict]) -> None:
        """On the loop: the splits not handed on before go to the enumerator."""
        new = [s for s in splits if s["splitId"] not in self.known]
        self.known.update(s["splitId"] for s in new)
        if new:
            self.on_new(new)

    def snapshot(self) -> list[str]:
        return sorted(self.known)

    def restore(self, known: list[str] | set[str]) -> None:
        self.known = set(known)


class FixedSplits(Discovery):
    """A source whose splits are known when it starts (FakeSource): one hand-on, complete."""

    def __init__(
        self,
        loop: CoordinatorEventLoop,
        on_new: Callable[[list[dict]], None],
        splits: list[dict],
    ) -> None:
        super().__init__(loop, on_new)
        self.splits = splits

    def start(self) -> None:
        def found() -> None:
            self.complete = True  # before the hand-on: the enumerator may end the input there
            self.hand_on(self.splits)

        self.loop.post(found)
