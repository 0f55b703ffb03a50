"""The job graph's layout (dashboard.graph) on real plans: plugins in the column of their depth,
one band per pipeline, edges from each plugin to what consumes it, no two boxes on each other,
and the same graph from the summary's ``dag`` a finished job keeps."""

from __future__ import annotations

from dashboard import graph
from engine.jobs import summary
from engine.jobs.planner import plan_job


def plans(config: str) -> list[tuple[int, dict]]:
    return [(n, p.to_json()) for n, p in enumerate(plan_job(config).pipelines, start=1)]


def by_path(drawn: dict) -> dict[str, dict]:
    return {n["path"]: n for n in drawn["nodes"]}


def no_overlap(drawn: dict) -> None:
    boxes = [(b["x"], b["y"], b["w"], b["h"]) for b in drawn["nodes"] + drawn["groups"]]
    for i, (x1, y1, w1, h1) in enumerate(boxes):
        assert 0 <= x1 and x1 + w1 <= drawn["width"] and 0 <= y1 and y1 + h1 <= drawn["height"]
        for x2, y2, w2, h2 in boxes[i + 1 :]:
            assert x1 + w1 <= x2 or x2 + w2 <= x1 or y1 + h1 <= y2 or y2 + h2 <= y1


def edges(drawn: dict) -> set[tuple[str, str]]:
    return {(e["source"], e["target"]) for e in drawn["edges"]}


def summary_pipelines(count: int, readers: int = 1, status: str = "RUNNING") -> list[dict]:
    """The job summary's pipelines: an enumerator and ``readers`` readers each."""
    return [
        {
            "pipelineId": p,
            "status": status,
            "taskGroups": [
                {
                    "taskGroupId": p * 1000 + i,
                    "kind": "ENUMERATOR" if i == 0 else "READER",
                    "index": max(i - 1, 0),
                    "status": status,
                    "attempt": 0,
                    "member": {"uuid": "u", "name": f"worker-{i % 2 + 1}"},
                    "metrics": {"rowsPerSecond": 12.5 if i else 0.0},
                }
                for i in range(readers + 1)
            ],
        }
        for p in range(1, count + 1)
    ]


def test_a_single_chain_runs_left_to_right_on_one_row():
    drawn = graph.layout(
        plans(
            "source { FakeSource { } }\ntransform { Copy { src_field = name, dest_field = n2 } }\n"
            "sink { Console { } }"
        ),
        summary_pipelines(1),
    )
    nodes = by_path(drawn)
    source, copy, sink = (
        nodes["source[0].FakeSource"],
        nodes["transform[0].Copy"],
        nodes["sink[0].Console"],
    )
    assert source["x"] < copy["x"] < sink["x"] and source["y"] == copy["y"] == sink["y"]
    assert (source["type"], copy["type"], sink["type"]) == ("source", "transform", "sink")
    assert {n["status"] for n in nodes.values()} == {"running"}
    assert edges(drawn) == {
        ("source[0].FakeSource", "transform[0].Copy"),
        ("transform[0].Copy", "sink[0].Console"),
    }
    assert [g["label"] for g in drawn["groups"]] == ["enumerator 0", "reader 0"]
    assert (
        drawn["groups"][1]["rowsPerSecond"] == 12.5 and drawn["groups"][0]["rowsPerSecond"] is None
    )
    assert [b["rowsPerSecond"] for b in drawn["bands"]] == [12.5]
    no_overlap(drawn)


def test_two_sources_into_two_sinks_by_plugin_input_are_two_bands():
    drawn = graph.layout(
        plans(
            "source {\n  FakeSource { plugin_output = a }\n  FakeSource { plugin_output = b }\n}\n"
            "sink {\n  Console { plugin_input = b }\n  Blackhole { plugin_input = a }\n}"
        ),
        summary_pipelines(2),
    )
    assert edges(drawn) == {
        ("source[0].FakeSource", "sink[1].Blackhole"),
        ("source[1].FakeSource", "sink[0].Console"),
    }
    first, second = drawn["bands"]
    assert first["y"] + first["height"] <= second["y"]
    nodes = by_path(drawn)
    for band, source, sink in (
        (first, "source[0].FakeSource", "sink[1].Blackhole"),
        (second, "source[1].FakeSource", "sink[0].Console"),
    ):
        for path in (source, sink):
            assert band["y"] < nodes[path]["y"] < band["y"] + band["height"]
    assert len(drawn["groups"]) == 4
    no_overlap(drawn)


def test_a_branch_puts_the_parent_between_its_children():
    drawn = graph.layout(
        plans(
            "source { FakeSource { plugin_output = a } }\n"
            "transform { Copy { plugin_input = a, plugin_output = c, src_field = name,"
            " dest_field = n2 } }\n"
            "sink {\n  Console { plugin_input = c }\n  Blackhole { plugin_input = a }\n}"
        ),
        summary_pipelines(1),
    )
    nodes = by_path(drawn)
    source, console, blackhole = (
        nodes["source[0].FakeSource"],
        nodes["sink[0].Console"],
        nodes["sink[1].Blackhole"],
    )
    assert console["y"] != blackhole["y"]
    assert min(console["y"], blackhole["y"]) < source["y"] < max(console["y"], blackhole["y"])
    assert nodes["transform[0].Copy"]["x"] == blackhole["x"] < console["x"]  # by depth
    no_overlap(drawn)


def test_a_multi_table_source_is_a_band_per_table_with_each_tables_sink():
    drawn = graph.layout(
        plans(
            "source { FakeSource { plugin_output = fake, tables_configs = [\n"
            '  { schema { table = "shop.orders", fields { id = bigint } } },\n'
            '  { schema { table = "shop.users", fields { id = int } } }\n] } }\n'
            "sink { Console { plugin_input = fake } }"
        ),
        summary_pipelines(2, readers=2),
    )
    assert edges(drawn) == {
        ("source[0].FakeSource.tables_configs[0]", "sink[0].Console@shop.orders"),
        ("source[0].FakeSource.tables_configs[1]", "sink[0].Console@shop.users"),
    }
    assert len(drawn["bands"]) == 2 and len(drawn["groups"]) == 6
    no_overlap(drawn)


def test_the_summary_dag_of_a_finished_job_draws_the_same_graph():
    config = (
        "source {\n  FakeSource { plugin_output = a }\n  FakeSource { plugin_output = b }\n}\n"
        "transform { Copy { plugin_input = a, plugin_output = c, src_field = name,"
        " dest_field = n2 } }\n"
        'sink {\n  Console { plugin_input = c }\n  Blackhole { plugin_input = ["a", "b"] }\n}'
    )
    direct = plans(config)
    # The dag as a finished job's history keeps it (engine.jobs.summary.dag).
    dag = summary.dag_of(direct)
    pipelines = summary_pipelines(2, status="FINISHED")
    from_dag = graph.layout(graph.plans_from_dag(dag), pipelines)
    drawn = graph.layout(direct, pipelines)
    assert from_dag == drawn
    assert {n["path"] for n in drawn["nodes"]} == {
        "source[0].FakeSource",
        "source[1].FakeSource",
        "transform[0].Copy",
        "sink[0].Console",
        "sink[1].Blackhole@a",
        "sink[1].Blackhole@b",
    }
    assert {n["status"] for n in drawn["nodes"]} == {"finished"}
    assert graph.layout(graph.plans_from_dag(None), pipelines) is None


def test_many_readers_are_counted_in_one_last_chip_and_long_names_are_cut():
    drawn = graph.layout(
        plans("source { FakeSource { } }\nsink { Console { } }"), summary_pipelines(1, readers=40)
    )
    assert len(drawn["groups"]) == graph.MAX_CHIPS
    (more,) = drawn["more"]
    assert more["count"] == 41 - graph.MAX_CHIPS and more["text"] == f"{more['count']} RUNNING"
    no_overlap({**drawn, "groups": drawn["groups"] + drawn["more"]})
    long_name = graph._short("x" * 100)
    assert len(long_name) == graph.LABEL_CHARS and long_name.endswith("…")


def test_a_long_name_is_cut_as_drawn_with_its_kind_and_a_chips_lines_too():
    """The box's first line is "Transform · <plugin>" as a whole, cut to what fits its 200 px;
    a chip's lines (label, attempt, status, member, rate) are cut whole as well."""
    plan = {
        "source": {"key": "s", "path": "source[0].FakeSource", "plugin": "FakeSource"},
        "transforms": [
            {
                "key": "t",
                "path": "transform[0].AVeryLongPluginNameFromSomeVendor@shop.order_lines_2026",
                "plugin": "AVeryLongPluginNameFromSomeVendor",
                "input": "s",
            }
        ],
        "sinks": [{"key": "k", "path": "sink[0].Console", "plugin": "Console", "input": "t"}],
    }
    pipelines = summary_pipelines(1)
    pipelines[0]["taskGroups"][1]["member"]["name"] = "worker-in-rack-17.example.internal"
    pipelines[0]["taskGroups"][1]["attempt"] = 12
    drawn = graph.layout([(1, plan)], pipelines)
    nodes = by_path(drawn)
    transform = nodes["transform[0].AVeryLongPluginNameFromSomeVendor@shop.order_lines_2026"]
    assert transform["label"].startswith("Transform · AVery") and transform["label"].endswith("…")
    assert len(transform["label"]) == graph.LABEL_CHARS
    # A path is cut in its middle: its start names the plugin, its end tells copies apart.
    assert len(transform["sub"]) == graph.PATH_CHARS
    assert transform["sub"].startswith("transform[0].A…")
    assert transform["sub"].endswith("lines_2026")
    assert nodes["sink[0].Console"]["label"] == "Sink · Console"  # a short one whole
    enumerator, reader = drawn["groups"]
    assert enumerator["title"] == "enumerator 0 · RUNNING"
    assert enumerator["sub"] == "att. 0 · worker-1"
    assert reader["title"] == "reader 0 · RUNNING"
    assert reader["sub"].startswith("att. 12 · worker-in-rack") and reader["sub"].endswith("…")
    assert len(reader["sub"]) == graph.CHIP_CHARS + 2
    assert reader["member"] == "worker-in-rack-17.example.internal"  # whole in its tooltip
    assert drawn["clip"] == {"nodeW": 194, "nodeH": graph.NODE_H, "chipW": 194, "chipH": 40}
