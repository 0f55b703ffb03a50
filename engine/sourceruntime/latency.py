"""A bounded latency histogram for the runtime's own metrics (a barrier's wait in the reader
mailbox, a command's admission through the broker).

Latencies fall into fixed buckets, four to a doubling from 1 µs up to about 17 s, so the
recorder's size never depends on how long a task group runs, and the histograms of many task
groups (or of many reports) merge exactly by adding their counts: a benchmark takes the p99 of
a whole job, not of one reader's last samples. A percentile is its bucket's upper bound (at
most 19% above the true value), never above the largest latency seen (which it is in the
last bucket).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

#: The first bucket's upper bound, in seconds, and the buckets per doubling after it.
FIRST = 1e-6
PER_DOUBLING = 4
BUCKETS = 24 * PER_DOUBLING + 1  # the last up to 2**24 µs (16.8 s), and beyond


def bucket_of(seconds: float) -> int:
    if seconds <= FIRST:
        return 0
    return min(BUCKETS - 1, math.ceil(math.log2(seconds / FIRST) * PER_DOUBLING - 1e-9))


def upper_ms(bucket: int) -> float:
    """The largest latency bucket ``bucket`` holds, in milliseconds."""
    return FIRST * 2 ** (bucket / PER_DOUBLING) * 1000


def percentile_ms(buckets: Mapping[int, int], p: float, max_ms: float | None = None) -> float:
    """The ``p`` quantile (0..1) of a histogram's ``{bucket: count}``, in milliseconds."""
    total = sum(buckets.values())
    if not total:
        return 0.0
    rank, seen = max(1, math.ceil(p * total)), 0
    for bucket in sorted(buckets):
        seen += buckets[bucket]
        if seen >= rank:
            if max_ms is None:
                return upper_ms(bucket)
            return max_ms if bucket == BUCKETS - 1 else min(upper_ms(bucket), max_ms)
    raise AssertionError("unreachable: the ranks end with the counts")


def merged(reports: Iterable[Mapping | None]) -> tuple[dict[int, int], float]:
    """The ``{bucket: count}`` and the largest latency (ms) of several ``to_json()`` reports."""
    buckets: dict[int, int] = {}
    largest = 0.0
    for report in reports:
        if not report:
            continue
        for bucket, count in report.get("buckets", {}).items():
            buckets[int(bucket)] = buckets.get(int(bucket), 0) + count
        largest = max(largest, report.get("maxMs", 0.0))
    return buckets, largest


class LatencyHistogram:
    """Latencies recorded by one thread (the loop that owns it) and reported by it."""

    __slots__ = ("counts", "largest")

    def __init__(self) -> None:
        self.counts = [0] * BUCKETS
        self.largest = 0.0

    def record(self, seconds: float) -> None:
        self.counts[bucket_of(seconds)] += 1
        if seconds > self.largest:
            self.largest = seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def to_json(self) -> dict:
        """``count``, ``p50Ms``, ``p99Ms``, ``maxMs`` and the non-empty ``buckets`` (bounded:
        at most BUCKETS keys, bucket numbers only)."""
        buckets = {i: n for i, n in enumerate(self.counts) if n}
        largest = round(self.largest * 1000, 3)
        return {
            "count": sum(buckets.values()),
            "p50Ms": round(percentile_ms(buckets, 0.50, largest), 3),
            "p99Ms": round(percentile_ms(buckets, 0.99, largest), 3),
            "maxMs": largest,
            "buckets": {str(i): n for i, n in buckets.items()},
        }
