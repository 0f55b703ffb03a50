"""From a job config to a plan: validated env, plugins, wiring, pipelines and task groups.

Independent source -> ... -> sink chains become separate pipelines. Each pipeline runs as one
enumerator task group plus ``parallelism`` reader task groups (source -> transforms -> sinks in
one thread), each in its own slot, as Zeta does: parallelism 10 needs 11 slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from engine.connectors import get_plugin, plugin_names, validate_block
from engine.connectors.batches import ROW_KIND
from engine.jobconfig import SECTIONS, ConfigError, PluginBlock, parse_job_config
from engine.jobs import wiring
from engine.jobs.envoptions import MAX_PARALLELISM, validate_env
from engine.jobs.multitable import mentions_table, per_table
from engine.sourceruntime import LEGACY, Lane, SourceRuntime
from engine.sourceruntime import choose as choose_lane


@dataclass
class PlanNode:
    key: str  # "source", "t0", "t1", ... or "k0", "k1" for sinks
    path: str  # source[0].FakeSource
    plugin: str
    config: dict[str, Any]
    input: str | None = None  # key of the node it consumes
    schema: list | None = None  # output schema (sources and transforms)

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "path": self.path,
            "plugin": self.plugin,
            "config": self.config,
            "input": self.input,
            "schema": self.schema,
        }

    @classmethod
    def from_json(cls, data: dict) -> PlanNode:
        return cls(**data)


@dataclass
class PipelinePlan:
    source: PlanNode
    transforms: list[PlanNode] = field(default_factory=list)
    sinks: list[PlanNode] = field(default_factory=list)
    #: Readers of this pipeline: the source's own ``parallelism``, else the job's.
    parallelism: int = 1
    #: The source's lane and capability digest (engine.sourceruntime), chosen once here.
    source_runtime: dict = field(default_factory=LEGACY.to_json)

    def to_json(self) -> dict:
        return {
            "source": self.source.to_json(),
            "transforms": [t.to_json() for t in self.transforms],
            "sinks": [s.to_json() for s in self.sinks],
            "parallelism": self.parallelism,
            "sourceRuntime": self.source_runtime,
        }

    @classmethod
    def from_json(cls, data: dict) -> PipelinePlan:
        return cls(
            source=PlanNode.from_json(data["source"]),
            transforms=[PlanNode.from_json(t) for t in data["transforms"]],
            sinks=[PlanNode.from_json(k) for k in data["sinks"]],
            parallelism=data.get("parallelism", 1),
            # A plan made before lanes existed ran in Lane B, and stays there.
            source_runtime=SourceRuntime.from_json(data.get("sourceRuntime")).to_json(),
        )


@dataclass
class JobPlan:
    name: str
    mode: str
    parallelism: int
    env: dict[str, Any]
    pipelines: list[PipelinePlan]
    #: ``[{path, message}]``: what was accepted but has no effect here.
    warnings: list[dict] = field(default_factory=list)

    @property
    def slots_needed(self) -> int:
        """An enumerator and the readers of each pipeline, each in its own slot."""
        return sum(1 + p.parallelism for p in self.pipelines)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "mode": self.mode,
            "parallelism": self.parallelism,
            "env": self.env,
            "pipelines": [p.to_json() for p in self.pipelines],
            "warnings": self.warnings,
        }

    @classmethod
    def from_json(cls, data: dict) -> JobPlan:
        return cls(
            name=data["name"],
            mode=data["mode"],
            parallelism=data["parallelism"],
            env=data["env"],
            pipelines=[PipelinePlan.from_json(p) for p in data["pipelines"]],
            warnings=data.get("warnings", []),
        )


def connects(text: str, variables: dict[str, str] | None = None) -> bool:
    """Whether planning the config opens network connections (a Jdbc source or sink): those
    checks run in a worker, not in the web process (engine.jobs.submission)."""
    job = parse_job_config(text, variables)
    return any(
        getattr(get_plugin(block.section, block.name), "connects", False)
        for section in SECTIONS
        for block in job.section(section)
    )


def plan_job(
    text: str, job_name: str | None = None, variables: dict[str, str] | None = None
) -> JobPlan:
    """Parse, validate and plan a job config; raise ConfigError listing every problem."""
    job = parse_job_config(text, variables)
    env, errors, warnings = validate_env(job.env)
    nodes: dict[str, list[PlanNode | None]] = {s: [] for s in SECTIONS}
    plugins: dict[str, Any] = {}
    for section in SECTIONS:
        for block in job.section(section):
            node = _plan_node(block, errors, warnings)
            nodes[section].append(node)
            if node is not None:
                plugins[node.path] = get_plugin(section, block.name)(node.config, node.path)
    if errors:
        raise ConfigError(errors)
    pipelines = _wire(nodes, plugins, errors, warnings)
    if errors:
        raise ConfigError(errors)
    for pipeline in pipelines:
        pipeline.parallelism = pipeline.source.config.get("parallelism") or env["parallelism"]
        # The source's splits depend on its readers (FakeSource's row.num is per reader).
        pipeline.source.config["parallelism"] = pipeline.parallelism
        source_plugin = get_plugin("source", pipeline.source.plugin)
        for option, message in source_plugin.mode_problems(pipeline.source.config, env["job.mode"]):
            error = {"path": f"{pipeline.source.path}.{option}", "message": message}
            if error not in errors:  # a multi-table source's tables share its options
                errors.append(error)
        pipeline.source_runtime = choose_lane(source_plugin, settings.ENGINE).to_json()
        if pipeline.source_runtime["lane"] == Lane.LEGACY:
            for option in getattr(source_plugin, "managed_only_options", ()):
                if pipeline.source.config.get(option) is not None:
                    warnings.append(
                        {
                            "path": f"{pipeline.source.path}.{option}",
                            "message": "no effect: the source runs in Lane B (the managed lane "
                            "needs it in engine.source-runtime.managed-connectors)",
                        }
                    )
        if pipeline.parallelism > MAX_PARALLELISM:
            path = f"{pipeline.source.path}.parallelism"
            errors.append({"path": path, "message": f"must be at most {MAX_PARALLELISM}"})
    if errors:
        raise ConfigError(errors)
    readers = sum(p.parallelism for p in pipelines)
    limit = settings.ENGINE["config.max-readers"]
    if readers > limit:
        raise ConfigError(
            [
                {
                    "path": "env.parallelism",
                    "message": f"{len(pipelines)} pipelines with {readers} readers in all, "
                    f"over the limit of {limit} (engine.config.max-readers)",
                }
            ]
        )
    name = job_name or env["job.name"] or "keel-job"
    env["job.name"] = name
    return JobPlan(
        name=name,
        mode=env["job.mode"],
        parallelism=env["parallelism"],
        env=env,
        pipelines=pipelines,
        warnings=warnings,
    )


def _plan_node(block: PluginBlock, errors: list[dict], warnings: list[dict]) -> PlanNode | None:
    plugin = get_plugin(block.section, block.name)
    if plugin is None:
        known = ", ".join(plugin_names(block.section))
        error = {
            "path": block.path,
            "message": f"unknown {block.section} plugin {block.name!r} (known: {known})",
        }
        if block.line:
            error["line"] = block.line
        errors.append(error)
        return None
    deferred = block.section != "source" and mentions_table(block.options)
    config, block_errors, block_warnings = validate_block(plugin, block, check=not deferred)
    errors += block_errors
    warnings += block_warnings
    if config is None:
        return None
    prefix = {"source": "s", "transform": "t", "sink": "k"}[block.section]
    return PlanNode(
        key=f"{prefix}{block.index}", path=block.path, plugin=plugin.name, config=config
    )


def _wire(nodes: dict[str, list], plugins: dict, errors: list[dict], warnings: list[dict]):
    """Connect plugins by plugin_output/plugin_input, SeaTunnel's way (engine.jobs.wiring),
    into a pipeline per source (and per table of a multi-table source)."""
    sources, transforms, sinks = nodes["source"], nodes["transform"], nodes["sink"]
    for node in transforms + sinks:
        if node.config.get("parallelism") is not None:
            warnings.append(
                {
                    "path": f"{node.path}.parallelism",
                    "message": "no effect: a pipeline's transforms and sinks run in each of its "
                    "readers (the source's parallelism)",
                }
            )
    inputs = wiring.resolve(sources, transforms, sinks, errors, warnings)
    if errors:
        return []
    reached = set(inputs)
    for node in transforms + sinks:
        if node.key not in reached:
            errors.append(
                {"path": f"{node.path}.plugin_input", "message": "there is no stream to consume"}
            )
    trees = wiring.trees(sources, transforms, sinks, inputs, errors)
    if errors:
        return []
    pipelines: list[PipelinePlan] = []
    for source, members, outs in trees:
        if not outs:
            errors.append(
                {"path": f"{source.path}", "message": "no sink consumes this source's output"}
            )
            continue
        for node in members + outs:  # each copy's plugin sees the one stream it consumes
            section = "sink" if node.key.startswith("k") else "transform"
            plugins[node.path] = get_plugin(section, node.plugin)(node.config, node.path)
        for table_source, table_members, table_outs in per_table(
            source, members, outs, plugins, errors
        ):
            plan = PipelinePlan(source=table_source, transforms=table_members, sinks=table_outs)
            _propagate_schema(plan, plugins, errors)
            pipelines.append(plan)
    consumed = {k for producers in inputs.values() for k in producers}
    for t in transforms:
        if t.key not in consumed:
            errors.append({"path": t.path, "message": "no sink consumes this transform's output"})
    return pipelines


def _reserved_field(path: str, schema, errors: list[dict]) -> None:
    """A stream may not name a field as the data plane's row-kind column (it would be read as
    each row's kind)."""
    if ROW_KIND in schema.names:
        errors.append({"path": path, "message": f"the field name {ROW_KIND} is reserved"})


def _propagate_schema(plan: PipelinePlan, plugins: dict, errors: list[dict]) -> None:
    try:
        schemas = {plan.source.key: plugins[plan.source.path].output_schema()}
    except Exception as exc:
        errors.append({"path": plan.source.path, "message": f"cannot read its schema: {exc}"})
        return
    plan.source.schema = schemas[plan.source.key].to_json()
    _reserved_field(plan.source.path, schemas[plan.source.key], errors)
    pending = list(plan.transforms)
    while pending:
        progressed = False
        for t in list(pending):
            if t.input in schemas:
                try:
                    schemas[t.key] = plugins[t.path].output_schema(schemas[t.input])
                    t.schema = schemas[t.key].to_json()
                    _reserved_field(t.path, schemas[t.key], errors)
                except ValueError as exc:
                    errors.append({"path": t.path, "message": str(exc)})
                    schemas[t.key] = schemas[t.input]
                pending.remove(t)
                progressed = True
        if not progressed:  # pragma: no cover - cycles are rejected before
            break
    for sink in plan.sinks:
        check = getattr(plugins[sink.path], "input_errors", None)
        if check is not None and sink.input in schemas:
            try:
                problems = check(schemas[sink.input])
            except Exception as exc:
                problems = [("", f"cannot check the target: {exc}")]
            for option, message in problems:
                path = f"{sink.path}.{option}" if option else sink.path
                errors.append({"path": path, "message": message})
