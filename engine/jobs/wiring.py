"""How a job's plugins connect: SeaTunnel's rule, then a tree per source.

SeaTunnel keeps the streams made so far in insertion order, under each plugin's
``plugin_output`` (one shared default name when it has none). A transform or sink consumes the
streams its ``plugin_input`` names; one that names none (or, in a job of one source, at most one
transform and one sink, names one nobody makes) consumes the stream made last, which is the
plugin before it. A transform naming a stream a later transform makes waits for it.

Keel runs a pipeline per source, so the graph is then cut into one tree per source: a plugin
consuming several streams (a multi-table sink, ``plugin_input = [a, b]``, or a transform that
unions them) is copied into each of their pipelines, its path marked ``@<stream>``.
"""

from __future__ import annotations

from dataclasses import replace

#: The name of a stream whose plugin does not name it (SeaTunnel's default table id).
DEFAULT = "\x00default"


def input_names(node) -> list[str]:
    """The streams a transform or sink names (plugin_input: a name, a list, or ``a,b``)."""
    value = node.config.get("plugin_input")
    if not value:
        return []
    return list(value) if isinstance(value, list) else [value]


def _output(node) -> str:
    return node.config.get("plugin_output") or DEFAULT


def _simple(sources: list, transforms: list, sinks: list) -> bool:
    """SeaTunnel's simple graph, whose names it does not hold a job to."""
    return len(sources) == 1 and len(sinks) == 1 and len(transforms) <= 1


def resolve(
    sources: list, transforms: list, sinks: list, errors: list[dict], warnings: list[dict]
) -> dict[str, list[str]]:
    """{consumer key: [producer keys]} for every transform and sink, in SeaTunnel's order."""
    made: dict[str, str] = {}  # stream name -> key of its producer; keeps insertion order
    paths = {n.key: n.path for n in sources + transforms}
    for node in sources:
        if not _unique(node, made, paths, errors):
            continue
        made[_output(node)] = node.key
    simple = _simple(sources, transforms, sinks)
    promised = {_output(t) for t in transforms}
    inputs: dict[str, list[str]] = {}
    pending = list(transforms)
    stalled = 0
    while pending:
        node = pending.pop(0)
        found = _consume(node, made, promised, simple, errors, warnings)
        if found is None:  # names a stream a later transform makes: after that one
            pending.append(node)
            stalled += 1
            if stalled > len(pending):
                for waiting in pending:
                    errors.append(
                        {
                            "path": f"{waiting.path}.plugin_input",
                            "message": "the transforms form a cycle",
                        }
                    )
                return {}
            continue
        stalled = 0
        inputs[node.key] = found
        if found and _unique(node, made, paths, errors):
            made[_output(node)] = node.key
    for node in sinks:
        found = _consume(node, made, set(), simple, errors, warnings)
        if found:
            inputs[node.key] = found
    return inputs


def _unique(node, made: dict[str, str], paths: dict[str, str], errors: list[dict]) -> bool:
    out = _output(node)
    if out != DEFAULT and out in made:
        errors.append(
            {
                "path": f"{node.path}.plugin_output",
                "message": f"{out!r} is already produced by {paths[made[out]]}",
            }
        )
        return False
    return True


def _consume(node, made, promised, simple, errors, warnings) -> list[str] | None:
    """The producers a node consumes; None when it must wait for a later transform."""
    names = input_names(node)
    found = [made[n] for n in names if n in made]
    missing = [n for n in names if n not in made]
    if missing and any(n in promised for n in missing):
        return None
    if names and missing and not simple:
        for name in missing:
            errors.append(
                {
                    "path": f"{node.path}.plugin_input",
                    "message": f"no source or transform produces {name!r}",
                }
            )
        return []
    if found:
        return list(dict.fromkeys(found))
    if not made:
        return []
    if DEFAULT in made and not names:
        return [made[DEFAULT]]
    last = list(made.values())[-1]
    if names:
        warnings.append(
            {
                "path": f"{node.path}.plugin_input",
                "message": f"no plugin produces {names[0]!r}: it consumes the stream made "
                "before it, as SeaTunnel does in a job of one source and one sink",
            }
        )
    return [last]


def trees(sources: list, transforms: list, sinks: list, inputs: dict, errors: list[dict]):
    """[(source, transforms, sinks)]: each source with copies of everything downstream of it,
    each copy consuming one stream (``input`` set)."""
    consumers: dict[str, list] = {}
    for node in transforms + sinks:
        for producer in inputs.get(node.key, []):
            consumers.setdefault(producer, []).append(node)
    by_key = {n.key: n for n in sources + transforms}
    return [(s, *_tree(s, consumers, inputs, by_key, errors)) for s in sources]


def _tree(source, consumers: dict, inputs: dict, by_key: dict, errors: list[dict]):
    """(transforms, sinks) downstream of one source, in the order of the config."""
    members: list = []
    outs: list = []
    seen: set[str] = set()
    stack = [(source, "")]
    while stack:
        parent, suffix = stack.pop()
        below = []
        for node in consumers.get(parent.key, []):
            if node.key in seen:
                errors.append(
                    {
                        "path": f"{node.path}.plugin_input",
                        "message": f"consumes two streams that both come from {source.path}: "
                        "a pipeline runs one source's rows, and cannot join its branches",
                    }
                )
                continue
            seen.add(node.key)
            mark = suffix
            if len(inputs[node.key]) > 1:
                mark += "@" + _stream_label(by_key[parent.key])
            copy = replace(node, input=parent.key, path=node.path + mark)
            copy.config = dict(node.config, plugin_input=_named(by_key[parent.key]))
            (outs if node.key.startswith("k") else members).append(copy)
            if not node.key.startswith("k"):
                below.append((copy, mark))
        stack.extend(reversed(below))
    members.sort(key=_position)
    outs.sort(key=_position)
    return members, outs


def _position(node) -> int:
    """A plugin's place in its section (keys are ``t3``, ``k0``)."""
    return int(node.key[1:])


def _named(producer) -> str | None:
    """The name a consumer's copy reads its one stream by (the Sql transform's table)."""
    return producer.config.get("plugin_output") or None


def _stream_label(producer) -> str:
    return producer.config.get("plugin_output") or producer.path
