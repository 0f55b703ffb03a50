"""The worker's garbage-collector settings for a data plane of short-lived row tuples."""

from __future__ import annotations

import gc


def tune_for_rows() -> None:
    """Keep everything loaded so far out of the cyclic GC (it lives as long as the process, and
    full collections would otherwise walk the whole Django/Celery heap again and again while
    the data plane allocates rows), and collect the young generation less often: rows are
    short-lived tuples of scalars."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
