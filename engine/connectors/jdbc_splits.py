"""How a Jdbc source cuts its partition column into ranges.

With ``partition_column`` (or without ``split.size``): ``split.num`` ranges of an even stride
between the bounds, as Spark does. Without ``partition_column`` and with ``split.size``, as
SeaTunnel's dynamic chunks: ranges of the key of about ``split.size`` rows each. An evenly
spread key (rows per value between the ``split.even-distribution.factor`` bounds) is cut by
stride; an uneven one at its quantiles, read from every row, or from a sample of one row in
``split.inverse-sampling.rate`` when more than ``split.sample-sharding.threshold`` ranges are
due.

A partition column of another type (text, a date, a numeric, ...) is cut at its quantiles:
``split.num`` ranges of about as many rows each (``split.size`` rows each for a key without
``partition_column``), bounded by values of the column read by the dialect (as literals of
the column's type: ``values`` in the split), so each non-null value falls in one range.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from engine.connectors.jdbc_options import INVERSE_SAMPLING_RATE


def split_option_errors(config: dict) -> list[tuple[str, str]]:
    """The split options' checks; the docs' ``split.inverse-sampling-rate`` is taken as the
    code's ``split.inverse-sampling.rate``."""
    code, docs = (
        config["split.inverse-sampling.rate"],
        config.pop("split.inverse-sampling-rate", None),
    )
    if code is not None and docs is not None and code != docs:
        return [("split.inverse-sampling-rate", f"says {docs}, split.inverse-sampling.rate {code}")]
    config["split.inverse-sampling.rate"] = code or docs or INVERSE_SAMPLING_RATE
    lower = config["split.even-distribution.factor.lower-bound"]
    upper = config["split.even-distribution.factor.upper-bound"]
    if lower > upper:
        return [
            (
                "split.even-distribution.factor.lower-bound",
                "must not be above split.even-distribution.factor.upper-bound",
            )
        ]
    return []


def bound_errors(config: dict, column: str, integer: bool) -> list[tuple[str, str]]:
    """``partition_lower_bound`` and ``partition_upper_bound`` set an integer column's
    stride; a column of another type is cut at its quantiles."""
    for bound in ("partition_lower_bound", "partition_upper_bound"):
        if column and not integer and config.get(bound) is not None:
            return [(bound, f"needs an integer partition_column ({column!r} is not)")]
    return []


def even_ranges(first: int, last: int, count: int) -> list[tuple[int, int]]:
    """``count`` ranges [start, end) of an even stride over first..last (fewer when the span
    is shorter); the last one ends after ``last``."""
    step = max((last - first + 1) // count, 1)
    out: list[tuple[int, int]] = []
    start = first
    while start <= last:
        end = last + 1 if len(out) == count - 1 else min(start + step, last + 1)
        out.append((start, end))
        start = end
    return out


#: A dialect's quantiles of the partition column: (step, sampling probability or None) ->
#: every ``step``-th value of the column's non-null values in order (of a sample of them).
Quantiles = Callable[[int, float | None], list[int]]


def chunk_ranges(
    config: dict, stats: tuple[int, int, int], quantiles: Quantiles
) -> list[tuple[int, int]]:
    """SeaTunnel's dynamic chunks of ``split.size`` rows: ``stats`` is (min, max, count of
    the key's non-null values); ``quantiles`` reads the cuts of an uneven key."""
    low, high, count = stats
    size = config["split.size"]
    chunks = max(math.ceil(count / size), 1)
    factor = (high - low + 1) / max(count, 1)
    lower = config.get("split.even-distribution.factor.lower-bound", 0.05)
    upper = config.get("split.even-distribution.factor.upper-bound", 100.0)
    if chunks == 1 or lower <= factor <= upper:
        return even_ranges(low, high, chunks)
    rate = config.get("split.inverse-sampling.rate") or INVERSE_SAMPLING_RATE
    sampled = chunks > config.get("split.sample-sharding.threshold", 1000) and rate > 1
    step = max(size // rate, 1) if sampled else size
    bounds = quantiles(step, 1 / rate if sampled else None)
    edges = [low, *[b for b in bounds if low < b <= high], high + 1]
    return [(a, b) for a, b in itertools.pairwise(edges) if a < b]


def plan_splits(
    config: dict,
    column: str,
    keys: list[str],
    stats: tuple[int | None, int | None, int, int],
    quantiles: Quantiles,
) -> list[dict]:
    """A source's splits, whatever its database: contiguous ranges of ``column`` (``split.num``
    of an even stride between the bounds, or chunks of ``split.size`` rows), the first and
    last open-ended (the bounds set the stride only), plus one split for its NULLs. ``stats``
    is (min, max, NULLs, non-null count) of the column; ``keys`` the table's primary key."""
    low, high, nulls, count = stats
    base = {"column": column, "order": [column, *[k for k in keys if k != column]]}
    base["total"] = bool(keys)
    base["byteOrder"] = True  # ties broken byte by byte (a split made before: by collation)
    splits = []
    if low is not None:
        if config.get("split.size") and not config.get("partition_column"):
            ranges = chunk_ranges(config, (int(low), int(high), int(count)), quantiles)
        else:
            first, last = int(low), int(high)
            if config.get("partition_lower_bound") is not None:
                first = config["partition_lower_bound"]
            if config.get("partition_upper_bound") is not None:
                last = max(config["partition_upper_bound"], first)
            ranges = even_ranges(first, last, config.get("split.num") or 4)
        splits = [
            {**base, "splitId": f"range-{start}-{end}", "low": start, "high": end}
            for start, end in ranges
        ]
        splits[0]["open_low"], splits[-1]["open_high"] = True, True
    if nulls and int(nulls):
        splits.append({**base, "splitId": "nulls", "low": None, "high": None})
    return splits


#: A dialect's quantiles of a partition column of any type: (step, sampling probability or
#: None) -> every ``step``-th value in order, each as the text the dialect's reads compare
#: the column with (a literal of its type).
ValueQuantiles = Callable[[int, float | None], list[str]]


def plan_value_splits(
    config: dict, column: str, keys: list[str], counts: tuple[int, int], quantiles: ValueQuantiles
) -> list[dict]:
    """The splits of a partition column that is not an integer: ranges between its quantiles
    (the first and last open-ended), plus one split for its NULLs. ``counts``: (NULLs,
    non-null values)."""
    nulls, count = (int(n) for n in counts)
    base = {"column": column, "order": [column, *[k for k in keys if k != column]]}
    base |= {"total": bool(keys), "values": True, "byteOrder": True}
    splits = []
    if count:
        if config.get("split.size") and not config.get("partition_column"):
            wanted = math.ceil(count / config["split.size"])
        else:
            wanted = config.get("split.num") or 4
        step = max(math.ceil(count / wanted), 1)
        rate = config.get("split.inverse-sampling.rate") or INVERSE_SAMPLING_RATE
        sampled = wanted > config.get("split.sample-sharding.threshold", 1000) and rate > 1
        bounds = quantiles(max(step // rate, 1), 1 / rate) if sampled else quantiles(step, None)
        bounds = bounds[: wanted - 1]  # the last quantile would start a range of its own
        edges = [None, *[b for i, b in enumerate(bounds) if i == 0 or b != bounds[i - 1]], None]
        for i, (low, high) in enumerate(itertools.pairwise(edges)):
            splits.append(
                {
                    **base,
                    "splitId": f"values-{i}",
                    "low": "" if low is None else low,
                    "high": high,
                    "open_low": low is None,
                    "open_high": high is None,
                }
            )
    if nulls:
        splits.append({**base, "splitId": "nulls", "low": None, "high": None})
    return splits
