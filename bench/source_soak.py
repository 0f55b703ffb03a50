"""A soak of Lane A under split storms: whether the runtime's state stays flat.

A STREAMING LocalFile job in Lane A (its directory scanned for new files every second) into
Blackhole, on a cluster of its own; every ``--storm-every`` seconds a storm of ``--files`` small
files (one row each) is dropped into the directory at once (written beside it, then renamed in),
for ``--seconds`` (default an hour). In step with the storms, every few seconds, it samples what
must not grow with the files seen so far:

- the enumerator's split assignment tracker (entries, bytes), its pending splits and the
  payload bytes of its commands not yet admitted, from its runtime metrics;
- the readers' mailbox bytes and the splits they hold (``assignments.APPLIED``);
- the known files, and the enumerator's and readers' snapshot sizes, from the newest
  checkpoint's acks;
- the worker processes' resident memory (/proc/<pid>/status).

At the end it prints, for each, the first third's and the last third's maximum (flat: the last
within 10% of the first, plus a little slack) and the least-squares slope per hour; and how long
each storm took to be read, and the checkpoints' p99. It measures: whether the state is bounded
is what it finds out. ``./run bench source_soak [--seconds S] [--files N] [--storm-every S]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench._cluster_samples import (
    TERMINAL,
    mib,
    percentile,
    sample_processes,
    slope_per_hour,
    thirds,
    worker_pids,
)
from tests.clusterkit import Cluster, DatabaseTemplate
from tests.faultkit import PrivatePostgres

SECONDS = float(os.environ.get("KEEL_BENCH_SOAK_SECONDS", "3600"))
STORM_FILES = 10_000
STORM_EVERY = 120.0
SAMPLE_EVERY = 5.0
READERS = 2
CONFIG = """
env {{ job.mode = STREAMING, parallelism = {readers}, checkpoint.interval = 2000 }}
source {{ LocalFile {{ path = "{inbox}", file_format_type = csv, file.discovery.interval = 1000,
                      schema {{ fields {{ id = bigint, name = string }} }} }} }}
sink {{ Blackhole {{ }} }}
"""
#: What each series may grow by and still be flat: (fraction of the first third's max, slack).
SERIES = {
    "tracker entries": (0.10, 100),
    "tracker bytes": (0.10, 64 * 1024),
    "pending splits": (0.10, 100),
    "enumerator unadmitted bytes": (0.10, 64 * 1024),
    "reader mailbox bytes": (0.10, 64 * 1024),
    "reader assignments": (0.10, 100),
    "known files": (0.10, 100),
    "enumerator snapshot bytes": (0.10, 64 * 1024),
    "reader snapshot bytes": (0.10, 64 * 1024),
    "worker RSS bytes": (0.10, 16 * 2**20),
}

RUNTIME = """
SELECT kind, source_runtime, source_received FROM engine_taskgroup WHERE job_id = %s
"""
#: The newest checkpoint's acks: each task group's kind, snapshot size and, for the enumerator,
#: how many files its discovery knows (a list of split ids, or a window's ``items``).
SNAPSHOTS = """
SELECT g.kind, a.size_bytes,
       CASE WHEN jsonb_typeof(a.state::jsonb -> 'managed' -> 'known') = 'array'
            THEN jsonb_array_length(a.state::jsonb -> 'managed' -> 'known')
            WHEN jsonb_typeof(a.state::jsonb -> 'managed' -> 'known' -> 'items') = 'array'
            THEN jsonb_array_length(a.state::jsonb -> 'managed' -> 'known' -> 'items') END
  FROM engine_taskcheckpoint a JOIN engine_taskgroup g ON g.id = a.task_group_id
 WHERE a.checkpoint_id = (SELECT max(c.id) FROM engine_checkpoint c
                           WHERE c.job_id = %s AND c.state = 'COMPLETED')
"""


class Soak:
    def __init__(self, cluster: Cluster, inbox: Path, files: int) -> None:
        self.cluster, self.inbox, self.files = cluster, inbox, files
        self.staging = inbox / ".staging"  # hidden: never listed by the source
        self.staging.mkdir(parents=True)
        self.job_id = 0
        self.dropped = 0  # rows (a row a file)
        self.storms: list[tuple[float, int]] = []  # (when dropped, rows dropped by then)
        self.read_by: dict[int, float] = {}  # storm -> when its rows were all read
        self.series: dict[str, list[tuple[float, float]]] = {name: [] for name in SERIES}
        self.checkpoints: dict[int, tuple[str, float]] = {}
        self.backpressure = 0
        self.started = time.monotonic()

    def storm(self) -> None:
        """``files`` files of a row each, written hidden, then renamed in one after another."""
        storm = len(self.storms)
        for i in range(self.files):
            (self.staging / f"{storm}-{i}").write_text(f"{self.dropped + i},s{storm}\n")
        for i in range(self.files):
            os.rename(self.staging / f"{storm}-{i}", self.inbox / f"s{storm:04d}-{i:05d}.csv")
        self.dropped += self.files
        self.storms.append((time.monotonic(), self.dropped))

    def sample(self) -> str:
        """One sample of every series; the job's status."""
        now = time.monotonic() - self.started
        rows = self.cluster.query(RUNTIME, (self.job_id,))
        metrics = {name: 0.0 for name in SERIES}
        received = 0
        for kind, runtime, read in rows:
            runtime = runtime or {}
            if kind == "ENUMERATOR":
                coordinator = runtime.get("coordinator") or {}
                metrics["tracker entries"] = sum((runtime.get("assignments") or {}).values())
                metrics["tracker bytes"] = coordinator.get("trackerBytes", 0)
                metrics["pending splits"] = coordinator.get("pendingSplits", 0)
                metrics["enumerator unadmitted bytes"] = (runtime.get("mailbox") or {}).get(
                    "bytes", 0
                )
                self.backpressure = coordinator.get("backpressure", 0)
            else:
                received += read
                metrics["reader mailbox bytes"] += (runtime.get("mailbox") or {}).get("bytes", 0)
                metrics["reader assignments"] += (runtime.get("assignments") or {}).get(
                    "APPLIED", 0
                )
        for kind, size, known in self.cluster.query(SNAPSHOTS, (self.job_id,)):
            if kind == "ENUMERATOR":
                metrics["enumerator snapshot bytes"] = size
                metrics["known files"] = known or 0
            else:
                metrics["reader snapshot bytes"] += size
        metrics["worker RSS bytes"] = sample_processes(worker_pids(self.cluster)).rss
        for name, value in metrics.items():
            self.series[name].append((now, float(value)))
        for storm, (_, upto) in enumerate(self.storms):
            if storm not in self.read_by and received >= upto:
                self.read_by[storm] = time.monotonic()
        for checkpoint_id, state, seconds in self.cluster.query(
            "SELECT checkpoint_id, state, extract(epoch FROM ended_at - triggered_at) "
            "FROM engine_checkpointrecord WHERE job_id = %s",
            (self.job_id,),
        ):
            self.checkpoints[checkpoint_id] = (state, float(seconds))
        return self.cluster.one("SELECT status FROM engine_job WHERE id = %s", (self.job_id,))

    def run(self, seconds: float, storm_every: float) -> str:
        code, body = self.cluster.post(
            "/api/v1/jobs", {"config": CONFIG.format(readers=READERS, inbox=self.inbox)}
        )
        assert code == 201, body
        self.job_id = body["jobId"]
        self.started = time.monotonic()
        next_storm = next_sample = self.started
        end = self.started + seconds
        status = "RUNNING"
        while time.monotonic() < end and status not in TERMINAL:
            now = time.monotonic()
            if now >= next_storm:
                self.storm()
                next_storm += storm_every
            if now >= next_sample:
                status = self.sample()
                next_sample += SAMPLE_EVERY
            time.sleep(max(0.0, min(next_storm, next_sample, end) - time.monotonic()))
        return status

    def report(self, seconds: float, storm_every: float, status: str) -> None:
        print(
            f"soak: {seconds:.0f} s of a STREAMING LocalFile job in Lane A ({READERS} readers, "
            f"discovery every 1 s, a checkpoint every 2 s) into Blackhole, a storm of "
            f"{self.files:,} files every {storm_every:.0f} s ({len(self.storms)} storms, "
            f"{self.dropped:,} files); the job {status} at the end:"
        )
        times = [self.read_by[s] - at for s, (at, _) in enumerate(self.storms) if s in self.read_by]
        unread = len(self.storms) - len(times)
        if times:
            print(
                f"  a storm read in (sampled every 5 s): median {statistics.median(times):.0f} "
                f"s, max {max(times):.0f} s; {unread} storm(s) not all read by the end"
            )
        ended = list(self.checkpoints.values())
        completed = [s for state, s in ended if state == "COMPLETED"]
        print(
            f"  checkpoints ({len(ended)} seen ended): {len(completed)} completed, "
            f"{len(ended) - len(completed)} not; p99 {percentile(completed, 0.99) * 1000:,.0f} ms"
            f"; tracker backpressure {self.backpressure}"
        )
        print(f"  {'':<28} {'first third max':>16} {'last third max':>16} {'slope/hour':>14}")
        for name, points in self.series.items():
            if not points:
                continue
            tolerance, slack = SERIES[name]
            first, last = thirds(points)
            ok = last <= first * (1 + tolerance) + slack
            shown = mib if name.endswith("RSS bytes") else "{:,.0f}".format
            print(
                f"  {name:<28} {shown(first):>16} {shown(last):>16} "
                f"{shown(slope_per_hour(points)):>14}  {'flat' if ok else 'GROWS'}"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench source_soak")
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--files", type=int, default=STORM_FILES, help="files a storm")
    parser.add_argument("--storm-every", type=float, default=STORM_EVERY, help="seconds")
    args = parser.parse_args(argv or [])
    base = Path(tempfile.mkdtemp(prefix="keel-soak-"))
    with PrivatePostgres({"max_connections": 200}) as postgres:
        template = DatabaseTemplate(postgres.url)
        cluster = Cluster(template, masters=1, workers=2, slots=2, heartbeat_timeout=30.0)
        cluster.env["KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS"] = "LocalFile"
        cluster.env["KEEL_CONNECTORS_FILE_ROOTS"] = str(base)
        try:
            cluster.up()
            soak = Soak(cluster, base / "inbox", args.files)
            status = soak.run(args.seconds, args.storm_every)
            soak.report(args.seconds, args.storm_every, status)
        finally:
            cluster.down()
            template.drop_all()
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
