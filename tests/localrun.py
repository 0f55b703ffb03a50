"""Run a BATCH job's pipelines in this process, through the engine's own data plane
(``run_reader``): what a worker's reader does, without a cluster (the sinks' save modes
first, as the first enumerator applies them). For tests of what connectors
and transforms read and write."""

from __future__ import annotations

import threading

from engine.jobs.planner import plan_job
from engine.member.dataplane import instantiate, run_reader
from engine.member.savemodes import due_sinks
from engine.states import JobMode


def run_batch(config_text: str, job_id: int = 1, variables: dict | None = None) -> dict:
    """Plan ``config_text`` (ConfigError if invalid) and run each pipeline's readers in turn;
    returns {"received": rows read, "written": rows written, "warnings": the plan's}."""
    plan = plan_job(config_text, None, variables or {})
    assert plan.mode == JobMode.BATCH
    # The job's save modes, once, before its first row: what the first enumerator does.
    for sink in due_sinks([pipeline.to_json() for pipeline in plan.pipelines]):
        sink.apply_save_modes()
    totals = {"received": 0, "written": 0, "warnings": plan.warnings}
    for pipeline_id, pipeline in enumerate(plan.pipelines, start=1):
        data = pipeline.to_json()
        splits = instantiate(data["source"]).create_splits(JobMode.BATCH)
        for reader in range(pipeline.parallelism):
            mine = [
                {"splitId": s["splitId"], "split": s, "offset": 0}
                for i, s in enumerate(splits)
                if i % pipeline.parallelism == reader
            ]
            counters = run_reader(
                data,
                mine,
                JobMode.BATCH,
                {"jobId": job_id, "pipelineId": pipeline_id, "readerIndex": reader, "attempt": 1},
                threading.Event(),
                on_progress=lambda counters, current: None,
                on_split_done=lambda split_id, offset: None,
            )
            totals["received"] += counters.received
            totals["written"] += counters.written
    return totals
