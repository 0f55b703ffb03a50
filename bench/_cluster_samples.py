"""Measuring a job on a local cluster from outside it, for the source runtime's benchmarks.

- The readers' reports: each task group writes its rows once a second, and PostgreSQL stamps
  the row as it lands (``updated_at``), so rows over time come from the engine's own records.
- The cluster's worker processes, from /proc: CPU seconds (``utime + stime``) and resident
  memory (``VmRSS``), sampled by the benchmark on the same host's clock.
- Checkpoints (trigger to completion, the master's own timestamps) and the Lane A task groups'
  runtime metrics (``engine_taskgroup.source_runtime``, their last report).
"""

from __future__ import annotations

import bisect
import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engine.sourceruntime.latency import merged, percentile_ms
from tests.clusterkit import Cluster

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: How often a watch samples (the readers report once a second).
SAMPLE_EVERY = 0.25
TERMINAL = ("FINISHED", "FAILED", "CANCELED")


def worker_pids(cluster: Cluster) -> list[int]:
    return [
        pid for name, pid in sorted(cluster.pids().items()) if name.startswith("worker-") and pid
    ]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


@dataclass
class ProcessSample:
    at: float  # time.time(), the clock PostgreSQL's timestamps are on (the same host)
    cpu: float  # the worker processes' CPU seconds, summed
    rss: int  # their resident bytes, summed


def sample_processes(pids: list[int]) -> ProcessSample:
    return ProcessSample(
        time.time(), sum(cpu_seconds(p) for p in pids), sum(rss_bytes(p) for p in pids)
    )


@dataclass
class JobWatch:
    """A job's readers' reports and the workers' CPU and memory, sampled until it ends."""

    cluster: Cluster
    job_id: int
    pids: list[int]
    #: Per reader task group: its reports as (PostgreSQL's time of it, rows so far).
    reports: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    processes: list[ProcessSample] = field(default_factory=list)
    status: str = ""

    def sample(self) -> None:
        rows = self.cluster.query(
            "SELECT t.id, t.source_received, extract(epoch FROM t.updated_at), j.status "
            "FROM engine_taskgroup t JOIN engine_job j ON j.id = t.job_id "
            "WHERE t.job_id = %s AND t.kind = 'READER'",
            (self.job_id,),
        )
        for group_id, received, at, status in rows:
            seen = self.reports.setdefault(group_id, [])
            if received and (not seen or seen[-1][1] != received):
                seen.append((float(at), received))
            self.status = status
        self.processes.append(sample_processes(self.pids))

    def until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Sample until ``done()`` (asked after each sample) or the job ends."""
        deadline = time.monotonic() + timeout
        while True:
            self.sample()
            if self.status == "FAILED":
                error = self.cluster.one(
                    "SELECT error_msg FROM engine_job WHERE id = %s", (self.job_id,)
                )
                raise AssertionError(f"job {self.job_id} FAILED: {error}")
            if done() or self.status in TERMINAL:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"job {self.job_id}: no {what} within {timeout} s")
            time.sleep(SAMPLE_EVERY)

    def steady_for(self, readers: int) -> float:
        """Seconds of steady state so far: from the latest of the ``readers`` readers' second
        reports of rows to the earliest of their latest reports (0 before every one has two)."""
        if len(self.reports) < readers or any(len(r) < 2 for r in self.reports.values()):
            return 0.0
        start = max(r[1][0] for r in self.reports.values())
        return max(0.0, min(r[-1][0] for r in self.reports.values()) - start)

    def until_ended(self, timeout: float) -> str:
        self.until(lambda: False, timeout, "end")
        return self.status


def interpolate(points: list[tuple[float, float]], at: float) -> float:
    """The value at ``at`` of a series of (time, value), linear between its points (the first
    or last value outside them)."""
    times = [t for t, _ in points]
    i = bisect.bisect_left(times, at)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (t0, v0), (t1, v1) = points[i - 1], points[i]
    return v0 + (v1 - v0) * (at - t0) / (t1 - t0) if t1 > t0 else v1


def steady_span(reports: dict[int, list[tuple[float, int]]], until: float):
    """When every reader was reading, up to ``until`` (when the job was asked to stop): from
    the latest reader's second report (a whole second read after its start) to the earliest of
    the readers' last reports before ``until``. None if they never overlapped so."""
    if not reports or any(len(r) < 3 for r in reports.values()):
        return None
    start = max(r[1][0] for r in reports.values())
    end = min(max((t for t, _ in r if t <= until), default=0.0) for r in reports.values())
    return (start, end) if end > start + 1 else None


def rows_at(reports: dict[int, list[tuple[float, int]]], at: float) -> float:
    return sum(interpolate(r, at) for r in reports.values())


def windows(reports: dict, span: tuple[float, float], width: float = 1.0) -> list[float]:
    """The job's rows per second in consecutive windows of ``width`` seconds across ``span``."""
    start, end = span
    edges = [start + i * width for i in range(int((end - start) // width) + 1)]
    totals = [rows_at(reports, t) for t in edges]
    return [(b - a) / width for a, b in itertools.pairwise(totals)]


@dataclass
class SteadyFigures:
    """One run's steady state: rows/s windows, CPU seconds per million rows, worker memory."""

    windows: list[float]
    cpu_per_mrows: float
    rss_peak: int
    rss_median: float


def steady_figures(watch: JobWatch, started: float, until: float) -> SteadyFigures | None:
    """The figures of the steady span; memory over the whole run, ``started`` to ``until``."""
    span = steady_span(watch.reports, until)
    if span is None:
        return None
    cpu = [(s.at, s.cpu) for s in watch.processes]
    rows = rows_at(watch.reports, span[1]) - rows_at(watch.reports, span[0])
    spent = interpolate(cpu, span[1]) - interpolate(cpu, span[0])
    during = [s.rss for s in watch.processes if started <= s.at <= until]
    return SteadyFigures(
        windows(watch.reports, span), spent / rows * 1e6, max(during), statistics.median(during)
    )


def checkpoint_seconds(cluster: Cluster, job_id: int) -> tuple[list[float], int]:
    """Each completed checkpoint of the job, from its trigger to its completion, and how many
    ended otherwise: from the checkpoint records (kept as each ends, the newest 100 a job),
    since ``checkpoint.max-retained`` keeps only a few checkpoint rows."""
    rows = cluster.query(
        "SELECT state, extract(epoch FROM ended_at - triggered_at) FROM engine_checkpointrecord "
        "WHERE job_id = %s",
        (job_id,),
    )
    completed = [float(s) for state, s in rows if state == "COMPLETED"]
    return completed, len(rows) - len(completed)


def runtime_reports(cluster: Cluster, job_id: int, kind: str, key: str) -> list[dict]:
    """``source_runtime[key]`` of the job's task groups of ``kind`` (their last reports)."""
    return [
        r
        for (r,) in cluster.query(
            "SELECT source_runtime -> %s FROM engine_taskgroup WHERE job_id = %s AND kind = %s",
            (key, job_id, kind),
        )
        if r
    ]


def latency_summary(reports: Iterable[dict]) -> tuple[int, float, float, float]:
    """(count, p50, p99, max in ms) of latency histograms merged (LatencyHistogram.to_json)."""
    buckets, largest = merged(reports)
    return (
        sum(buckets.values()),
        percentile_ms(buckets, 0.50, largest),
        percentile_ms(buckets, 0.99, largest),
        largest,
    )


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else float("nan")


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, value), per hour."""
    if len(points) < 2:
        return 0.0
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if not spread:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread * 3600


def thirds(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The first third's and the last third's largest value of a series (a soak's growth
    shows as the second above the first)."""
    third = max(1, len(points) // 3)
    return max(v for _, v in points[:third]), max(v for _, v in points[-third:])


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def goal(met: bool) -> str:
    return "met" if met else "NOT met"


def ratio_line(label: str, a: float, b: float, fmt: Callable[[float], str], ok: bool) -> str:
    return f"  {label + ':':<34} A {fmt(a):>14}  B {fmt(b):>14}  A/B {a / b:6.3f}  {goal(ok)}"
