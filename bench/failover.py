"""Failover timing on a real local cluster (OS processes, PostgreSQL, Redis).

- election: kill -9 the active master 10 times; time from the kill to a new active master with a
  higher epoch, as seen in PostgreSQL;
- worker-crash detection: kill -9 a worker 5 times; time from the kill to its member REMOVED.
Each is printed as min/median/max and as a ratio to the timeout a lease- or heartbeat-only
design would have to wait (both measured in this run's configuration).
"""

from __future__ import annotations

import os
import signal
import statistics
import time

from tests.clusterkit import Cluster, DatabaseTemplate, wait_for

KILLS = 10
WORKER_KILLS = 5
HEARTBEAT_TIMEOUT = 5.0
LEASE_TIMEOUT = 3.0


def summary(name: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return (
        f"{name}: n={len(ms)} min={min(ms):.0f} ms median={statistics.median(ms):.0f} ms "
        f"max={max(ms):.0f} ms"
    )


def measure_elections(cluster: Cluster) -> list[float]:
    samples = []
    for _ in range(KILLS):
        epoch, holder = wait_for(cluster.active_master, 10, what="an active master")
        pid = cluster.pid(holder)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(
            lambda e=epoch: (m := cluster.active_master()) and m[0] > e,
            10,
            interval=0.002,
            what="a new active master",
        )
        samples.append(time.monotonic() - t0)
        cluster.start(holder)  # back as a standby for the next round
    return samples


def measure_worker_detection(cluster: Cluster) -> list[float]:
    samples = []
    for _ in range(WORKER_KILLS):
        member_id = cluster.one(
            "SELECT id FROM engine_member WHERE name = 'worker-1' AND state = 'ALIVE'"
        )
        os.kill(cluster.pid("worker-1"), signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(
            lambda m=member_id: cluster.one(
                "SELECT state = 'REMOVED' FROM engine_member WHERE id = %s", (m,)
            ),
            HEARTBEAT_TIMEOUT + 5,
            interval=0.002,
            what="the worker to be REMOVED",
        )
        samples.append(time.monotonic() - t0)
        cluster.start("worker-1")
    return samples


def main() -> None:
    template = DatabaseTemplate()
    cluster = Cluster(template, masters=2, workers=2, slots=4, heartbeat_timeout=HEARTBEAT_TIMEOUT)
    try:
        cluster.up()
        elections = measure_elections(cluster)
        detections = measure_worker_detection(cluster)
    finally:
        cluster.down()
        template.drop_all()
    print(summary("election after kill -9 of the active master", elections))
    print(
        f"  ratio median election / lease timeout ({LEASE_TIMEOUT:.0f} s): "
        f"{statistics.median(elections) / LEASE_TIMEOUT:.3f}"
    )
    print(summary("worker-crash detection after kill -9", detections))
    print(
        f"  ratio median detection / heartbeat timeout ({HEARTBEAT_TIMEOUT:.0f} s): "
        f"{statistics.median(detections) / HEARTBEAT_TIMEOUT:.3f}"
    )


if __name__ == "__main__":
    main()
