"""How plugins connect, SeaTunnel's way: unnamed inputs take the stream made last, a sink may
consume several streams (a copy per stream, each in that stream's pipeline), and a transform
waits for a stream a later transform makes."""

from __future__ import annotations

import json

import pytest

from engine.jobconfig import ConfigError
from engine.jobs.planner import plan_job
from tests.localrun import run_batch


def errors_of(config: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        plan_job(config)
    return {e["path"]: e["message"] for e in caught.value.errors}


def shape(plan) -> list[tuple]:
    """Each pipeline as (source path, [(transform path, input key)], [(sink path, input)])."""
    return [
        (
            p.source.path,
            [(t.path, t.input) for t in p.transforms],
            [(k.path, k.input) for k in p.sinks],
        )
        for p in plan.pipelines
    ]


def test_a_named_source_and_an_unnamed_sink_connect():
    plan = plan_job("source { FakeSource { result_table_name = fake } }\nsink { Console { } }")
    assert shape(plan) == [("source[0].FakeSource", [], [("sink[0].Console", "s0")])]
    assert plan.warnings == []


def test_unnamed_plugins_take_the_stream_made_last_even_when_others_are_named():
    plan = plan_job(
        """
        source {
          FakeSource { plugin_output = a, schema { fields { id = int } } }
          FakeSource { plugin_output = b, schema { fields { id = int, name = string } } }
        }
        transform {
          Filter { include_fields = [id] }
          Sql { plugin_input = a, plugin_output = from_a, query = "select id from a" }
        }
        sink {
          Console { plugin_input = from_a }
          Console { }
        }
        """
    )
    assert shape(plan) == [
        ("source[0].FakeSource", [("transform[1].Sql", "s0")], [("sink[0].Console", "t1")]),
        ("source[1].FakeSource", [("transform[0].Filter", "s1")], [("sink[1].Console", "t0")]),
    ]


def test_a_sink_of_several_streams_is_copied_into_each_streams_pipeline(tmp_path):
    config = f"""
    env {{ job.mode = BATCH }}
    source {{
      FakeSource {{ result_table_name = fake, row.num = 5, schema {{ fields {{ id = int }} }} }}
      FakeSource {{ result_table_name = fake2, row.num = 7, schema {{ fields {{ id = int }} }} }}
    }}
    sink {{
      LocalFile {{
        source_table_name = ["fake", "fake2"]
        path = "{tmp_path}/out", file_format_type = json
      }}
    }}
    """
    plan = plan_job(config)
    assert [[k.path for k in p.sinks] for p in plan.pipelines] == [
        ["sink[0].LocalFile@fake"],
        ["sink[0].LocalFile@fake2"],
    ]
    assert run_batch(config)["written"] == 12
    lines = [
        json.loads(line)
        for part in sorted((tmp_path / "out").glob("*.jsonl"))
        for line in part.read_text().splitlines()
    ]
    assert len(lines) == 12  # both streams' parts, side by side in the one directory


def test_a_comma_list_names_several_streams_too():
    plan = plan_job(
        """
        source { FakeSource { plugin_output = a }
                 FakeSource { plugin_output = b } }
        sink { Blackhole { plugin_input = "a, b" } }
        """
    )
    assert [k.path for p in plan.pipelines for k in p.sinks] == [
        "sink[0].Blackhole@a",
        "sink[0].Blackhole@b",
    ]


def test_a_transform_of_several_streams_is_copied_with_everything_below_it():
    plan = plan_job(
        """
        source { FakeSource { plugin_output = a }
                 FakeSource { plugin_output = b } }
        transform { Filter { plugin_input = [a, b], plugin_output = f, include_fields = [id] } }
        sink { Blackhole { plugin_input = f } }
        """
    )
    assert shape(plan) == [
        (
            "source[0].FakeSource",
            [("transform[0].Filter@a", "s0")],
            [("sink[0].Blackhole@a", "t0")],
        ),
        (
            "source[1].FakeSource",
            [("transform[0].Filter@b", "s1")],
            [("sink[0].Blackhole@b", "t0")],
        ),
    ]


def test_a_transform_naming_a_later_transforms_stream_waits_for_it():
    plan = plan_job(
        """
        source { FakeSource { plugin_output = raw } }
        transform {
          Filter { plugin_input = narrow, plugin_output = narrower, include_fields = [id] }
          Filter { plugin_input = raw, plugin_output = narrow, include_fields = [id, name] }
        }
        sink { Console { plugin_input = narrower } }
        """
    )
    assert shape(plan) == [
        (
            "source[0].FakeSource",
            [("transform[0].Filter", "t1"), ("transform[1].Filter", "s0")],
            [("sink[0].Console", "t0")],
        )
    ]
    assert [name for name, _ in plan.pipelines[0].transforms[0].schema] == ["id"]


def test_transforms_waiting_for_each_other_are_a_cycle():
    errors = errors_of(
        """
        source { FakeSource { plugin_output = raw } }
        transform {
          Filter { plugin_input = y, plugin_output = x, include_fields = [id] }
          Filter { plugin_input = x, plugin_output = y, include_fields = [id] }
        }
        sink { Console { plugin_input = x } }
        """
    )
    assert errors["transform[0].Filter.plugin_input"] == "the transforms form a cycle"


def test_a_wrong_name_in_a_simple_job_is_wired_anyway_with_a_warning():
    plan = plan_job(
        "source { FakeSource { plugin_output = fake } }\nsink { Console { plugin_input = fak } }"
    )
    assert shape(plan) == [("source[0].FakeSource", [], [("sink[0].Console", "s0")])]
    assert plan.warnings[0]["path"] == "sink[0].Console.plugin_input"
    assert "no plugin produces 'fak'" in plan.warnings[0]["message"]


def test_a_wrong_name_in_a_larger_job_is_refused():
    errors = errors_of(
        """
        source { FakeSource { plugin_output = a }
                 FakeSource { plugin_output = b } }
        sink { Console { plugin_input = a }
               Console { plugin_input = c } }
        """
    )
    assert errors["sink[1].Console.plugin_input"] == "no source or transform produces 'c'"


def test_a_stream_left_unconsumed_is_refused():
    errors = errors_of(
        """
        source { FakeSource { plugin_output = a }
                 FakeSource { plugin_output = b } }
        sink { Console { plugin_input = b } }
        """
    )
    assert errors["source[0].FakeSource"] == "no sink consumes this source's output"


def test_two_branches_of_one_source_cannot_meet_again():
    errors = errors_of(
        """
        source { FakeSource { plugin_output = raw } }
        transform {
          Filter { plugin_input = raw, plugin_output = x, include_fields = [id] }
          Filter { plugin_input = raw, plugin_output = y, include_fields = [id] }
        }
        sink { Console { plugin_input = [x, y] } }
        """
    )
    assert "both come from source[0].FakeSource" in errors["sink[0].Console.plugin_input"]


def test_a_sinks_parallelism_is_accepted_with_a_warning():
    plan = plan_job("source { FakeSource { } }\nsink { Console { parallelism = 2 } }")
    assert [w["path"] for w in plan.warnings] == ["sink[0].Console.parallelism"]


def test_the_sql_transform_reads_its_default_input_by_the_streams_name():
    plan = plan_job(
        """
        source { FakeSource { plugin_output = fake, schema { fields { id = int } } } }
        transform { Sql { query = "select id + 1 as next from fake" } }
        sink { Console { } }
        """
    )
    sql = plan.pipelines[0].transforms[0]
    assert sql.config["plugin_input"] == "fake"
    assert sql.schema == [["next", "int"]]
