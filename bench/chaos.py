"""Chaos: for each fault in turn (tests/chaoskit.py), the time until data flows again (the
streaming job commits a checkpoint after the fault ended), the restores it caused, and the
rows lost and duplicated across the streaming job and that fault's batch job (goal: 0 and 0).
Then the same for each network partition (tests/partitionkit.py: engine processes on test
hosts of their own; skipped with the reason where test hosts cannot be made) and for a lost
primary whose synchronous standby is promoted (tests/standbykit.py).

Real processes on private PostgreSQL and Redis servers. Each time is also printed as a ratio
to the same wait measured in the same run, on the same cluster, with no fault (from an
arbitrary instant to the streaming job's next commit; checkpoints every 500 ms): how many
quiet commit waits the fault cost.
"""

from __future__ import annotations

import statistics
import time

from tests import netkit
from tests.chaoskit import FAULTS, Chaos, Outcome, chaos_cluster


def quiet_wait(chaos: Chaos) -> float:
    return statistics.median(chaos.wait_flowing(time.monotonic()) for _ in range(9))


def report(title: str, quiet: float, outcomes: list[Outcome]) -> bool:
    print(f"-- {title}")
    print(f"quiet: the next commit comes {quiet:.2f} s after an arbitrary instant (median of 9)")
    print(
        f"{'fault':<46} {'lasted s':>8} {'flows again s':>13} {'/ quiet':>8} {'restores':>8}"
        f" {'lost':>5} {'duplicated':>10} {'deposed writes':>14}  settled"
    )
    for o in outcomes:
        print(
            f"{o.fault:<46} {o.lasted:>8.1f} {o.flows_again:>13.1f} {o.flows_again / quiet:>8.1f}"
            f" {o.restores:>8} {o.lost:>5} {o.duplicated:>10} {o.dual_writes:>14}"
            f"  {'yes' if o.settled else 'NO'}"
        )
    return all(o.clean for o in outcomes)


def main() -> None:
    from tests.standbykit import failover_cluster, lose_the_primary

    clean = []
    with chaos_cluster() as chaos:
        quiet = quiet_wait(chaos)
        outcomes = [chaos.run(name, fault) for name, fault in FAULTS.items()]
    clean.append(report("process faults", quiet, outcomes))
    reason = netkit.available()
    if reason:
        print(f"-- partitions: skipped ({reason})")
    else:
        from tests.partitionkit import SCENARIOS, partition_cluster

        with partition_cluster() as p:
            quiet = quiet_wait(p)
            outcomes = [p.run(name, fault) for name, fault in SCENARIOS.items()]
        clean.append(report("partitions (engine processes on test hosts)", quiet, outcomes))
    with failover_cluster() as f:
        quiet = quiet_wait(f)
        outcomes = [f.run("primary lost, synchronous standby promoted", lose_the_primary)]
    clean.append(report("failover to a synchronous standby", quiet, outcomes))
    print(f"every row once, nothing stuck, no deposed write: {'met' if all(clean) else 'MISSED'}")
