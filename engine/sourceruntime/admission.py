"""A reader mailbox's admission latency against its objective (``admission.p99-budget``).

Admission runs on the operation threads (several at once), so the bounded histogram it records
into is guarded by a lock of its own, held for a bucket increment: admissions are per command,
never per record. The p99 is of every admission this attempt made; when it is over the budget
the reader's task group logs a warning at most once a ``WARN_INTERVAL``.
"""

from __future__ import annotations

import threading

from engine.sourceruntime.latency import LatencyHistogram

#: The shortest time between two warnings of one mailbox's admission p99 over its budget.
WARN_INTERVAL = 60.0
BUDGET_OPTION = "engine.source-runtime.admission.p99-budget"


class AdmissionLatency:
    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.over_budget = 0  # admissions that took longer than the budget
        self._histogram = LatencyHistogram()
        self._lock = threading.Lock()
        self._warned_at: float | None = None

    def record(self, seconds: float) -> None:
        with self._lock:
            self._histogram.record(seconds)
            if seconds > self.budget:
                self.over_budget += 1

    def to_json(self) -> dict:
        """``count``, ``p99Ms``, ``maxMs``, ``overBudget`` and ``budgetMs``: bounded keys."""
        with self._lock:
            histogram = self._histogram.to_json()
            over = self.over_budget
        return {
            "count": histogram["count"],
            "p99Ms": histogram["p99Ms"],
            "maxMs": histogram["maxMs"],
            "overBudget": over,
            "budgetMs": round(self.budget * 1000, 3),
        }

    def warning(self, now: float) -> str | None:
        """What to log now about a p99 over the budget (None: nothing, or said too recently)."""
        latency = self.to_json()
        if latency["p99Ms"] <= latency["budgetMs"]:
            return None
        if self._warned_at is not None and now - self._warned_at < WARN_INTERVAL:
            return None
        self._warned_at = now
        return (
            f"admission latency p99 {latency['p99Ms']} ms is over {BUDGET_OPTION} "
            f"({latency['budgetMs']} ms): {latency['overBudget']} of {latency['count']} "
            "admissions took longer"
        )
