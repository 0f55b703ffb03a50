"""Multi-table sources: a FakeSource with ``tables_configs``, a Jdbc source with ``table_list``,
becomes one pipeline per table.

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


def substitute(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: substitute(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, names) for v in value]
    if isinstance(value, str):
        for placeholder, name in names.items():
            value = value.replace(placeholder, name)
    return value


def per_table(source, transforms: list, sinks: list, plugins: dict, errors: list[dict]) -> list:
    """[(source, transforms, sinks)]: one per table of a multi-table source (the entries of
    its plugin's ``tables_option``), else the pipeline as it is (its deferred checks run here,
    with the source's table if it names one)."""
    plugin = get_plugin("source", source.plugin)
    option = plugin.tables_option
    tables = source.config.get(option) if option else None
    if not tables:
        names = plugin.placeholder_names(source.config)
        downstream = [_for_table(n, names, "", plugins, errors) for n in transforms + sinks]
        return [(source, downstream[: len(transforms)], downstream[len(transforms) :])]
    out = []
    for index, entry in enumerate(tables):
        table_source = _table_source(source, plugin, index, entry, plugins, errors)
        if table_source is None:
            continue
        names = plugin.placeholder_names(table_source.config)
        suffix = f"@{names.get('${table_full_name}') or index}"
        downstream = [_for_table(n, names, suffix, plugins, errors) for n in transforms + sinks]
        out.append((table_source, downstream[: len(transforms)], downstream[len(transforms) :]))
    return out


def _table_source(source, plugin, index: int, entry: Any, plugins: dict, errors: list[dict]):
    """The source of one entry of the plugin's ``tables_option``: the entry's options over
    the block's (an entry that sets an option by another of its names sets it too)."""
    option = plugin.tables_option
    path = f"{source.path}.{option}[{index}]"
    problem = plugin.table_entry_problem(entry)
    if problem:
        errors.append({"path": path, "message": problem})
        return None
    options = dict(entry)
    given = {plugin.aliases.get(name, name) for name in entry}
    for name, value in source.config.items():  # the block's options the entry does not set
        if name != option and value is not None and name not in given:
            if lookup(entry, name, None) is None:
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
