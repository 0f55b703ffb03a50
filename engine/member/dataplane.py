"""The data plane of one reader task group: source -> transforms -> sinks, batch by batch.

Runs in a runtime-owned thread (never a Celery pool thread). Plugin errors are re-raised as
PluginFailure naming the plugin (``transform[0].RowFilter``) and the cause, which becomes the
task group's, pipeline's and job's errorMsg.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from engine.connectors import get_plugin
from engine.connectors.base import SinkWriter
from engine.connectors.batches import ROW_SOURCE_BATCH, bounded, limits
from engine.connectors.schema import Schema
from engine.states import JobMode

#: The rows a row source (``read_rows``) builds at a time (Lane A reads blocks of a whole batch).
BATCH_SIZE = ROW_SOURCE_BATCH
METRICS_INTERVAL = 1.0
#: A source with nothing due is asked again after IDLE_WAIT_MIN, doubling while it stays idle
#: up to IDLE_WAIT_MAX (which also bounds how late a barrier is handled by an idle reader).
IDLE_WAIT_MIN = 0.01
IDLE_WAIT_MAX = 0.08


class PluginFailure(Exception):
    def __init__(self, path: str, exc: BaseException) -> None:
        super().__init__(f"{path}: {type(exc).__name__}: {exc}")
        self.path = path


def instantiate(node: dict):
    return get_plugin(_section(node["key"]), node["plugin"])(node["config"], node["path"])


def _section(key: str) -> str:
    return {"s": "source", "t": "transform", "k": "sink"}[key[0]]


def guarded(path: str, fn: Callable, *args):
    try:
        return fn(*args)
    except PluginFailure:
        raise
    except Exception as exc:
        raise PluginFailure(path, exc) from exc


@dataclass
class Chain:
    """The transforms and sinks downstream of a source, compiled for one reader."""

    steps: dict[str, tuple[str, Callable]]  # transform key -> (input key, processor)
    sinks: list[tuple[str, str, SinkWriter]]  # (path, input key, writer)
    paths: dict[str, str] = field(default_factory=dict)
    #: Wall-clock seconds spent in the sinks' ``write`` calls: the reader's back-pressure (a
    #: reader runs its sinks inline, so time in a write is time it cannot read).
    blocked_seconds: float = 0.0

    def push(self, source_key: str, batch) -> int:
        """Run one batch (an Arrow record batch) through the transforms into every sink;
        returns rows written."""
        return self.deliver(source_key, batch)[0]

    def deliver(self, source_key: str, batch, nbytes: int | None = None) -> tuple[int, int]:
        """``push``, returning (rows, bytes) written: bytes as Arrow counts a whole batch
        (``nbytes``), never per row; ``nbytes`` is the input batch's when the caller has it
        (a sink given the input itself costs no second count)."""
        outputs = {source_key: batch}
        pending = dict(self.steps)
        while pending:
            for key, (input_key, fn) in list(pending.items()):
                if input_key in outputs:
                    outputs[key] = guarded(self.paths[key], fn, outputs[input_key])
                    del pending[key]
        written = written_bytes = 0
        for path, input_key, writer in self.sinks:
            out = outputs[input_key]
            if out.num_rows:
                began = time.perf_counter()
                guarded(path, writer.write, out)
                self.blocked_seconds += time.perf_counter() - began
                written += out.num_rows
                same = out is batch and nbytes is not None
                written_bytes += nbytes if same else out.nbytes
        return written, written_bytes


def compile_chain(plan: dict, context: dict) -> tuple[object, Chain]:
    source_node = plan["source"]
    source = guarded(source_node["path"], instantiate, source_node)
    schemas = {source_node["key"]: Schema.from_json(source_node["schema"])}
    steps, paths = {}, {}
    for node in plan["transforms"]:
        plugin = guarded(node["path"], instantiate, node)
        steps[node["key"]] = (
            node["input"],
            guarded(node["path"], plugin.processor, schemas[node["input"]]),
        )
        schemas[node["key"]] = Schema.from_json(node["schema"])
        paths[node["key"]] = node["path"]
    sinks = []
    try:
        for node in plan["sinks"]:
            plugin = guarded(node["path"], instantiate, node)
            writer = guarded(
                node["path"],
                plugin.writer,
                schemas[node["input"]],
                {**context, "label": node["path"]},
            )
            sinks.append((node["path"], node["input"], writer))
    except BaseException:
        for _, _, writer in sinks:  # a later sink failed: release the ones already open
            try:
                writer.abort()
            except Exception:  # noqa: S110 - already failing
                pass
        raise
    return source, Chain(steps, sinks, paths)


@dataclass
class Counters:
    """A reader's counts: rows read and written, the Arrow bytes of their batches
    (``RecordBatch.nbytes``, SeaTunnel's SourceReceivedBytes and SinkWriteBytes), its rate, and
    its times: ``busy_seconds`` since it started (up to date at each ``roll``, final once
    settled) and ``blocked_seconds`` of those spent in its sinks' writes (``Chain``)."""

    received: int = 0
    written: int = 0
    received_bytes: int = 0
    written_bytes: int = 0
    window_start: float = field(default_factory=time.monotonic)
    window_rows: int = 0
    rate: float = 0.0
    busy_seconds: float = 0.0
    cpu_seconds: float = 0.0
    blocked_seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def add(
        self, received: int, written: int, received_bytes: int = 0, written_bytes: int = 0
    ) -> None:
        self.received += received
        self.written += written
        self.received_bytes += received_bytes
        self.written_bytes += written_bytes
        self.window_rows += received

    def roll(self, chain: Chain | None = None) -> None:
        """Close the rate's window; the times so far (blocked: ``chain``'s, when given)."""
        now = time.monotonic()
        elapsed = now - self.window_start
        if elapsed > 0:
            self.rate = self.window_rows / elapsed
        self.window_start, self.window_rows = now, 0
        self.busy_seconds = now - self.started
        if chain is not None:
            self.blocked_seconds = chain.blocked_seconds


def run_reader(
    plan: dict,
    splits: list[dict],
    mode: str,
    context: dict,
    stop: threading.Event,
    on_progress: Callable[[Counters, dict], None],
    on_split_done: Callable[[str, int], None],
    on_boundary: Callable[[dict, Chain], None] | None = None,
    input_done: Callable[[Chain], bool] = lambda chain: True,
    on_stopped: Callable[[Chain], None] = lambda chain: None,
) -> Counters:
    """Read every assigned split from its offset through the chain. Returns the counters.

    ``splits``: [{splitId, split, offset}]. ``on_progress`` is called at most once a second with
    the counters and the current {splitId: offset}; ``on_split_done`` when a split is exhausted;
    ``on_boundary`` between two batches with the positions of every split
    ({splitId: {offset, done}}) and the chain: where barriers and commits are handled, so a
    checkpoint cut is ordered with the data. A STREAMING reader never ends by itself: with no
    (more) splits it idles, still handling its mailbox, until stopped. A BATCH reader whose
    input is read idles the same way until ``input_done(chain)`` says it may end (a checkpointed
    reader: once its final checkpoint is committed), then closes its sinks. Stopped (cancel),
    it calls ``on_stopped`` before aborting its sinks: what completed is committed first.
    """
    started, cpu_started = time.monotonic(), time.thread_time()
    source, chain = compile_chain(plan, context)
    source_key, source_path = plan["source"]["key"], plan["source"]["path"]
    counters = Counters()
    positions = {a["splitId"]: {"offset": a["offset"], "done": False} for a in splits}
    last_report = time.monotonic()
    completed = False
    idle = 0.0
    max_rows, max_bytes = limits()

    def tick(current: dict) -> None:
        nonlocal last_report
        if on_boundary is not None:
            on_boundary(positions, chain)
        now = time.monotonic()
        if now - last_report >= METRICS_INTERVAL:
            counters.roll(chain)
            on_progress(counters, current)
            last_report = now

    try:
        for assignment in splits:
            split_id = assignment["splitId"]
            offset = assignment["offset"]
            reader = guarded(source_path, source.read, assignment["split"], offset, mode, max_rows)
            while not stop.is_set():
                try:
                    batch, offset = next(reader)
                except StopIteration:
                    break
                except Exception as exc:
                    raise PluginFailure(source_path, exc) from exc
                if batch is not None and batch.num_rows:
                    for part, size in sized_parts(batch, max_rows, max_bytes):
                        written, written_bytes = chain.deliver(source_key, part, size)
                        counters.add(part.num_rows, written, size, written_bytes)
                    idle = 0.0
                else:
                    # A paced or idle source: nothing due yet. Wait longer while it stays so
                    # (an idle reader must not cost a core between them).
                    idle = min(max(idle * 2, IDLE_WAIT_MIN), IDLE_WAIT_MAX)
                    stop.wait(idle)
                positions[split_id]["offset"] = offset
                tick({split_id: offset})
            if stop.is_set():
                break
            positions[split_id]["done"] = True
            on_split_done(split_id, offset)
        while not stop.is_set() and (mode == JobMode.STREAMING or not input_done(chain)):
            tick({})
            stop.wait(0.05)
        if not stop.is_set():
            for path, _, writer in chain.sinks:
                guarded(path, writer.close)
            completed = True
        else:
            on_stopped(chain)
    finally:
        settle(chain, counters, started, cpu_started, completed)
    return counters


def sized_parts(batch, max_rows: int, max_bytes: int) -> Iterator[tuple[object, int]]:
    """``batches.bounded``'s slices of a source's batch, each with its ``nbytes``: a batch
    within the bounds (the usual case) is measured once, not once to bound it and again to
    count it (Arrow's ``nbytes`` costs microseconds a call)."""
    size = batch.nbytes
    if batch.num_rows <= max_rows and size <= max_bytes:
        yield batch, size
        return
    for part in bounded(batch, max_rows, max_bytes):
        yield part, part.nbytes


def settle(chain: Chain, counters: Counters, started: float, cpu: float, completed: bool) -> None:
    """A reader's data plane ended: its times into ``counters``, and its sinks aborted unless
    they were closed (``completed``)."""
    counters.roll(chain)
    counters.busy_seconds = time.monotonic() - started
    counters.cpu_seconds = time.thread_time() - cpu
    if not completed:
        for _, _, writer in chain.sinks:
            try:
                writer.abort()
            except Exception:  # noqa: S110 - already failing or cancelled
                pass
