"""The job page's graph: each pipeline's sources, transforms and sinks as boxes in layers, the
edges between them, and the pipeline's task groups (enumerator and readers) below them.

The layout is computed here, on the server, into plain coordinates that the template draws as
SVG (so every text goes through the template's escaping, and the page needs no graph library).
A pipeline's plan is a tree (engine.jobs.wiring cuts the config's graph into one per source):
each plugin sits in the column of its depth, and leaves take the rows in the config's order
while a parent sits between its first and last child, so no two edges cross.
"""

from __future__ import annotations

from collections import defaultdict

NODE_W, NODE_H = 200, 44
COL_GAP, ROW_GAP = 56, 12
CHIP_W, CHIP_H, CHIP_GAP = 200, 40, 8
BAND_HEADER, BAND_GAP, PAD = 24, 16, 10
#: Task groups drawn per pipeline; the rest are counted in one last chip.
MAX_CHIPS = 12
#: Characters of a whole rendered line that fit a 200 px box at the page's fonts: a box's
#: first line ("Transform · FieldMapper", bold), its path, a chip's lines. Longer ones are cut
#: with an ellipsis (the template also clips each text to its box, whatever the font).
LABEL_CHARS = 25
PATH_CHARS = 29
CHIP_CHARS = 30
KIND = {"source": "Source", "transform": "Transform", "sink": "Sink"}


def plans_from_dag(dag: dict | None) -> list[tuple[int, dict]]:
    """[(pipeline id, plan)] from the job summary's ``dag`` (engine.jobs.summary.dag), which
    the history keeps: a finished job draws the same graph once its plans are cleaned up."""
    if not dag:
        return []
    vertices = {v["id"]: v for v in dag.get("vertices", [])}
    plans = []
    for pipeline_id, pairs in sorted(dag.get("edges", {}).items(), key=lambda kv: int(kv[0])):
        inputs = {to: source for source, to in pairs}
        ids = sorted({v for pair in pairs for v in pair} & vertices.keys())
        nodes = {
            kind: [
                {
                    "key": str(i),
                    "path": vertices[i]["path"],
                    "plugin": vertices[i]["plugin"],
                    "input": str(inputs[i]) if i in inputs else None,
                }
                for i in ids
                if vertices[i]["type"] == kind
            ]
            for kind in KIND
        }
        if len(nodes["source"]) != 1:
            continue
        plans.append(
            (
                int(pipeline_id),
                {
                    "source": nodes["source"][0],
                    "transforms": nodes["transform"],
                    "sinks": nodes["sink"],
                },
            )
        )
    return plans


def layout(plans: list[tuple[int, dict]], pipelines: list[dict]) -> dict | None:
    """The graph's boxes, edges and task-group chips with their coordinates, one band per
    pipeline; None without a plan. ``pipelines`` are the job summary's (status, task groups)."""
    if not plans:
        return None
    by_id = {p["pipelineId"]: p for p in pipelines}
    graph: dict = {"bands": [], "nodes": [], "edges": [], "groups": [], "more": []}
    top = PAD
    width = 0
    for pipeline_id, plan in plans:
        pipeline = by_id.get(pipeline_id, {})
        status = str(pipeline.get("status", "")).lower()
        nodes, edges, rows, columns = _pipeline_nodes(plan)
        band_top = top
        top += BAND_HEADER
        place = {}
        for node in nodes:
            x = PAD + columns[node["key"]] * (NODE_W + COL_GAP)
            y = top + round(rows[node["key"]] * (NODE_H + ROW_GAP))
            place[node["key"]] = (x, y)
            width = max(width, x + NODE_W)
            graph["nodes"].append(_node(node, x, y, status))
        for source, target in edges:
            graph["edges"].append(_edge(place, source, target, nodes, status))
        top += round((max(rows.values()) + 1) * (NODE_H + ROW_GAP))
        groups = pipeline.get("taskGroups", [])
        per_row = max(3, (width - PAD + CHIP_GAP) // (CHIP_W + CHIP_GAP))
        shown = groups[:MAX_CHIPS] if len(groups) > MAX_CHIPS + 1 else groups
        slots = len(shown) + (1 if len(shown) < len(groups) else 0)
        for n, group in enumerate(shown):
            x, y = _chip_at(n, per_row, top)
            graph["groups"].append(_chip(group, pipeline_id, x, y))
            width = max(width, x + CHIP_W)
        if len(shown) < len(groups):
            x, y = _chip_at(len(shown), per_row, top)
            graph["more"].append(_more(groups[len(shown) :], pipeline_id, x, y))
        top += -(-slots // per_row) * (CHIP_H + CHIP_GAP)
        graph["bands"].append(
            {
                "pipelineId": pipeline_id,
                "status": status,
                "statusText": pipeline.get("status", ""),
                "y": band_top,
                "height": top - band_top,
                "labelY": band_top + 16,
                "rowsPerSecond": _rate(groups),
            }
        )
        top += BAND_GAP
    graph["width"] = width + PAD
    graph["height"] = top - BAND_GAP + PAD
    # Each box's and chip's texts are clipped to it, a few pixels in from its right edge.
    graph["clip"] = {"nodeW": NODE_W - 6, "nodeH": NODE_H, "chipW": CHIP_W - 6, "chipH": CHIP_H}
    for band in graph["bands"]:
        band["width"] = graph["width"] - 2
    return graph


def _pipeline_nodes(plan: dict):
    """The plan's plugins in order, its edges, and each plugin's row and column."""
    nodes = [
        {**plan["source"], "type": "source"},
        *({**t, "type": "transform"} for t in plan.get("transforms", [])),
        *({**k, "type": "sink"} for k in plan.get("sinks", [])),
    ]
    keys = {n["key"] for n in nodes}
    edges = [(n["input"], n["key"]) for n in nodes[1:] if n.get("input") in keys]
    children: dict[str, list[str]] = defaultdict(list)
    for source, target in edges:
        children[source].append(target)
    root = nodes[0]["key"]
    columns = {root: 0}
    order = [root]
    for key in order:  # breadth first: a tree's depth is its parent's plus one
        for child in children[key]:
            if child not in columns:
                columns[child] = columns[key] + 1
                order.append(child)
    rows: dict[str, float] = {}
    leaves = 0
    for key in _leaves_in_order(root, children):
        rows[key] = leaves
        leaves += 1
    for key in reversed(order):  # breadth first reversed: children before their parents
        placed = [rows[c] for c in children[key] if c in rows]
        if placed:
            rows[key] = (placed[0] + placed[-1]) / 2
    stray = [n for n in nodes if n["key"] not in columns]  # not reached from the source
    for n in stray:
        columns[n["key"]] = 0
        rows[n["key"]] = leaves
        leaves += 1
    return nodes, edges, rows, columns


def _leaves_in_order(root: str, children: dict[str, list[str]]) -> list[str]:
    """The tree's leaves, depth first in the config's order (no recursion: a long chain)."""
    leaves, stack, seen = [], [root], set()
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        if children[key]:
            stack.extend(reversed(children[key]))
        else:
            leaves.append(key)
    return leaves


def _short(text: str, limit: int = LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short_path(text: str, limit: int = PATH_CHARS) -> str:
    """A plugin's path cut in its middle: its start names the plugin, its end what tells its
    copies apart (``tables_configs[1]``, the table after ``@``)."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def _node(node: dict, x: int, y: int, status: str) -> dict:
    return {
        "path": node["path"],
        "plugin": node["plugin"],
        "type": node["type"],
        "kind": KIND[node["type"]],
        "label": _short(f"{KIND[node['type']]} · {node['plugin']}"),
        "sub": _short_path(str(node["path"])),
        "status": status,
        "x": x,
        "y": y,
        "w": NODE_W,
        "h": NODE_H,
    }


def _edge(place: dict, source: str, target: str, nodes: list[dict], status: str) -> dict:
    (x1, y1), (x2, y2) = place[source], place[target]
    x1, y1, x2, y2 = x1 + NODE_W, y1 + NODE_H // 2, x2 - 2, y2 + NODE_H // 2
    middle = (x1 + x2) // 2
    paths = {n["key"]: n["path"] for n in nodes}
    return {
        "d": f"M{x1},{y1} C{middle},{y1} {middle},{y2} {x2},{y2}",
        "source": paths[source],
        "target": paths[target],
        "status": status,
    }


def _chip_at(n: int, per_row: int, top: int) -> tuple[int, int]:
    return PAD + (n % per_row) * (CHIP_W + CHIP_GAP), top + (n // per_row) * (CHIP_H + CHIP_GAP)


def _chip(group: dict, pipeline_id: int, x: int, y: int) -> dict:
    member = group.get("member") or {}
    rate = (group.get("metrics") or {}).get("rowsPerSecond")
    kind = str(group.get("kind", "")).lower()
    label = f"{kind} {group.get('index', '')}".strip()
    name = str(member.get("name") or "no member")
    where = f"att. {group.get('attempt')} · {name}"
    if kind == "reader" and rate is not None:
        where += f" · {rate} rows/s"
    return {
        "taskGroupId": group.get("taskGroupId"),
        "pipelineId": pipeline_id,
        "label": label,
        "status": str(group.get("status", "")).lower(),
        "statusText": group.get("status", ""),
        "attempt": group.get("attempt"),
        "member": name,
        "rowsPerSecond": rate if kind == "reader" else None,
        # The chip's two lines as drawn, each cut whole (the title says it all).
        "title": _short(f"{label} · {group.get('status', '')}", CHIP_CHARS),
        "sub": _short(where, CHIP_CHARS + 2),
        "x": x,
        "y": y,
        "w": CHIP_W,
        "h": CHIP_H,
    }


def _more(groups: list[dict], pipeline_id: int, x: int, y: int) -> dict:
    counts: dict[str, int] = defaultdict(int)
    for group in groups:
        counts[str(group.get("status", ""))] += 1
    text = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return {
        "pipelineId": pipeline_id,
        "count": len(groups),
        "text": _short(text, CHIP_CHARS + 2),
        "x": x,
        "y": y,
        "w": CHIP_W,
        "h": CHIP_H,
    }


def _rate(groups: list[dict]) -> float:
    return round(
        sum(
            (g.get("metrics") or {}).get("rowsPerSecond") or 0
            for g in groups
            if g.get("status") == "RUNNING"
        ),
        1,
    )
