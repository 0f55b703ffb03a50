"""Multi-table sources: a FakeSource with ``tables_configs`` becomes one pipeline per table.

SeaTunnel's multi-table source sends the rows of several tables down one pipeline and its sinks
route them by table. Keel's pipelines carry one schema each, so the plan has a pipeline per
table instead: the table's source, and copies of the transforms and sinks downstream, whose
string options have ``${database_name}``, ``${schema_name}``, ``${table_name}`` and
``${table_full_name}`` replaced by that table's names (as SeaTunnel's sinks do). A sink whose
options name the table is checked once its names are in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.connectors import get_plugin, validate_block
from engine.jobconfig import PluginBlock, lookup

PLACEHOLDERS = ("${database_name}", "${schema_name}", "${table_name}", "${table_full_name}")


def mentions_table(options: Any) -> bool:
    """Whether a block's options use a table placeholder anywhere."""
    if isinstance(options, dict):
        return any(mentions_table(v) for v in options.values())
    if isinstance(options, list):
        return any(mentions_table(v) for v in options)
    return isinstance(options, str) and any(p in options for p in PLACEHOLDERS)


def table_names(full_name: str) -> dict[str, str]:
    """``db.schema.table``, ``db.table`` or ``table`` as the placeholders' values."""
    parts = full_name.split(".")
    database = parts[0] if len(parts) > 1 else ""
    schema = parts[1] if len(parts) == 3 else ""
    return {
        "${database_name}": database,
        "${schema_name}": schema,
        "${table_name}": parts[-1],
        "${table_full_name}": full_name,
    }


def substitute(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: substitute(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, names) for v in value]
    if isinstance(value, str):
        for placeholder, name in names.items():
            value = value.replace(placeholder, name)
    return value


def _source_table(config: dict) -> str:
    schema = config.get("schema")
    table = schema.get("table") if isinstance(schema, dict) else None
    return str(table) if table else ""


def per_table(source, transforms: list, sinks: list, plugins: dict, errors: list[dict]) -> list:
    """[(source, transforms, sinks)]: one per table of a multi-table source, else the pipeline
    as it is (its deferred checks run here, with the source's table if it names one)."""
    tables = source.config.get("tables_configs")
    if not tables:
        names = table_names(_source_table(source.config)) if _source_table(source.config) else {}
        downstream = [_for_table(n, names, "", plugins, errors) for n in transforms + sinks]
        return [(source, downstream[: len(transforms)], downstream[len(transforms) :])]
    out = []
    for index, entry in enumerate(tables):
        table_source = _table_source(source, index, entry, plugins, errors)
        if table_source is None:
            continue
        names = table_names(_source_table(table_source.config))
        suffix = f"@{names['${table_full_name}']}"
        downstream = [_for_table(n, names, suffix, plugins, errors) for n in transforms + sinks]
        out.append((table_source, downstream[: len(transforms)], downstream[len(transforms) :]))
    return out


def _table_source(source, index: int, entry: Any, plugins: dict, errors: list[dict]):
    """The source of one entry of ``tables_configs``: the entry's options over the block's."""
    path = f"{source.path}.tables_configs[{index}]"
    schema = entry.get("schema") if isinstance(entry, dict) else None
    if not isinstance(schema, dict) or not schema.get("table") or not schema.get("fields"):
        errors.append({"path": path, "message": "needs schema { table = name, fields { ... } }"})
        return None
    plugin = get_plugin("source", source.plugin)
    options = dict(entry)
    for name, value in source.config.items():  # the block's options the entry does not set
        if name != "tables_configs" and value is not None and lookup(entry, name, None) is None:
            options[name] = value
    block = PluginBlock("source", 0, source.plugin, options)
    config, block_errors, _ = validate_block(plugin, block)
    prefix = f"{block.path}."
    for error in block_errors:
        errors.append({**error, "path": error["path"].replace(prefix, f"{path}.", 1)})
    if config is None:
        return None
    node = replace(source, path=path, config=config)
    plugins[path] = plugin(config, path)
    return node


def _for_table(node, names: dict[str, str], suffix: str, plugins: dict, errors: list[dict]):
    """A transform or sink for one table: its options with the table's names, and the check
    that was deferred until they are in."""
    mentioned = mentions_table(node.config)
    if not mentioned and not suffix:
        return node
    config = substitute(node.config, names) if mentioned and names else dict(node.config)
    node = replace(node, path=node.path + suffix, config=config)
    plugin = get_plugin("sink" if node.key.startswith("k") else "transform", node.plugin)
    if mentioned:
        for option, message in plugin.check(config):
            errors.append({"path": f"{node.path}.{option}", "message": message})
    plugins[node.path] = plugin(config, node.path)
    return node
