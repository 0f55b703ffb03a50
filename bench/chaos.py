"""Chaos: for each fault in turn (tests/chaoskit.py), the time until data flows again (the
streaming job commits a checkpoint after the fault ended), the restores it caused, and the
rows lost and duplicated across the streaming job and that fault's batch job (goal: 0 and 0).

Real processes on a private PostgreSQL and a private Redis. Each time is also printed as a
ratio to the same wait measured in the same run with no fault (from an arbitrary instant to the
streaming job's next commit; checkpoints every 500 ms): how many quiet commit waits the fault
cost.
"""

from __future__ import annotations

import statistics
import time

from tests.chaoskit import FAULTS, chaos_cluster


def main() -> None:
    outcomes = []
    with chaos_cluster() as chaos:
        quiet = statistics.median(chaos.wait_flowing(time.monotonic()) for _ in range(9))
        for name, fault in FAULTS.items():
            outcomes.append(chaos.run(name, fault))
    print(f"quiet: the next commit comes {quiet:.2f} s after an arbitrary instant (median of 9)")
    print(
        f"{'fault':<46} {'flows again s':>13} {'/ quiet':>8} {'restores':>8} {'lost':>5} "
        f"{'duplicated':>10}  settled"
    )
    for o in outcomes:
        print(
            f"{o.fault:<46} {o.flows_again:>13.1f} {o.flows_again / quiet:>8.1f} "
            f"{o.restores:>8} {o.lost:>5} {o.duplicated:>10}  {'yes' if o.settled else 'NO'}"
        )
    clean = all(o.lost == 0 and o.duplicated == 0 and o.settled for o in outcomes)
    print(
        f"rows lost {sum(o.lost for o in outcomes)}, duplicated "
        f"{sum(o.duplicated for o in outcomes)}: {'met' if clean else 'MISSED'}"
    )
