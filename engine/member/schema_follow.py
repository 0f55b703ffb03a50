"""A Lane A reader's chain after its source's schema changed: the plan computed again from the
new source schema, the sinks made to take their added columns, the chain compiled again.

A schema change is applied only with nothing of the old schema left uncommitted (every
checkpoint this attempt acked is committed), so the new writers open as a restore from the
newest committed checkpoint would: nothing staged or prepared is left behind them. A restore
whose snapshot holds a changed schema goes through the same steps before its first row (the
sinks' ``follow_schema`` is idempotent), so a failure between the schema checkpoint and the
sinks' change is made good by the restore.
"""

from __future__ import annotations

import copy
import threading
import time

from engine.connectors.base import SchemaNotFollowed
from engine.connectors.schema import Schema
from engine.member.dataplane import Chain, compile_chain, guarded, instantiate
from engine.sourceruntime.schema_change import SchemaChangePending


def evolved_plan(plan: dict, schema: list) -> dict:
    """``plan`` with the source's schema ``schema`` and each transform's output schema
    computed again from it (as the planner computes them)."""
    plan = copy.deepcopy(plan)
    plan["source"]["schema"] = schema
    schemas = {plan["source"]["key"]: Schema.from_json(schema)}
    pending = list(plan["transforms"])
    while pending:
        ready = [t for t in pending if t["input"] in schemas]
        if not ready:  # a cycle: the planner refused it before
            raise ValueError("the transforms' inputs do not reach the source")
        for node in ready:
            output = guarded(node["path"], instantiate(node).output_schema, schemas[node["input"]])
            node["schema"] = output.to_json()
            schemas[node["key"]] = output
            pending.remove(node)
    return plan


def _inputs(plan: dict) -> dict[str, Schema]:
    schemas = {plan["source"]["key"]: Schema.from_json(plan["source"]["schema"])}
    schemas |= {t["key"]: Schema.from_json(t["schema"]) for t in plan["transforms"]}
    return {sink["path"]: schemas[sink["input"]] for sink in plan["sinks"]}


def follow_sinks(before: dict, after: dict) -> int:
    """Each sink whose input gained columns from ``before`` to ``after`` takes them; returns
    how many sinks changed. ``SchemaChangePending`` passes through (tried again later); a sink
    that cannot follow raises ``SchemaNotFollowed`` naming it."""
    old, new = _inputs(before), _inputs(after)
    changed = 0
    for node in after["sinks"]:
        names = set(old[node["path"]].names)
        added = [(n, k) for n, k in new[node["path"]].fields if n not in names]
        if not added:
            continue
        try:
            instantiate(node).follow_schema(added)
        except SchemaChangePending:
            raise
        except Exception as exc:
            raise SchemaNotFollowed(f"{node['path']}: {exc}") from exc
        changed += 1
    return changed


def recompile(chain: Chain, plan: dict, context: dict) -> None:
    """``chain`` compiled again from ``plan`` in place (its writers opened anew with
    ``context``), after the old writers are released; its blocked time carries on. A failure
    leaves it with no writer (``compile_chain`` releases the new ones it opened)."""
    old, chain.sinks = chain.sinks, []
    for path, _, writer in old:
        guarded(path, writer.abort)
    _, fresh = compile_chain(plan, context)
    chain.steps, chain.sinks, chain.paths = fresh.steps, fresh.sinks, fresh.paths


def follow_restored(
    plan: dict, schema: list, deadline: float, stop: threading.Event
) -> dict | None:
    """A restore whose snapshot holds a changed schema: the plan for it, once the sinks took
    its columns (their lock waited for until ``deadline``, a monotonic time, or until the
    task group is told to stop: None)."""
    evolved = evolved_plan(plan, schema)
    while True:
        try:
            follow_sinks(plan, evolved)
            return evolved
        except SchemaChangePending:
            if time.monotonic() >= deadline:
                raise
            if stop.wait(0.2):  # a retry's back-off: another writer holds the table's lock
                return None
