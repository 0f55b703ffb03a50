"""The order the test lanes take modules in: the longest first (tests/durations.json), so that
no lane is left finishing a long module while the others idle. A module stays whole in one
lane (its cluster fixture is the module's); only the order of modules changes, which also
checks that none depends on another having run before it.

``KEEL_TEST_DURATIONS=write ./run test`` measures each module (setup, call and teardown of its
tests) and rewrites durations.json (a partial run updates only the modules it ran); a module
the file does not name counts as ``UNKNOWN`` seconds.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN = 1.0


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` module by module, the longest module first (stable within one)."""
    try:
        weights = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        weights = {}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(_module(item.nodeid), index)

    def key(item: pytest.Item) -> tuple[float, int]:
        module = _module(item.nodeid)
        return (-float(weights.get(module, UNKNOWN)), first_seen[module])

    items.sort(key=key)  # stable: a module's own order is kept


class Recorder:
    """Each module's seconds in this run, written to durations.json at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_module(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return  # a lane: the controller sees every lane's reports
        try:
            known = json.loads(DURATIONS.read_text())
        except (OSError, ValueError):
            known = {}
        known.update(self.seconds)  # a partial run keeps the other modules' numbers
        ranked = sorted(known.items(), key=lambda kv: -kv[1])
        DURATIONS.write_text(json.dumps({m: round(s, 1) for m, s in ranked}, indent=1) + "\n")


def register(config: pytest.Config) -> None:
    if os.environ.get("KEEL_TEST_DURATIONS") == "write":
        config.pluginmanager.register(Recorder(), "keel-durations")
