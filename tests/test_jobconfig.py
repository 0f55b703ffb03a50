"""The job-config parser: duplicate plugin blocks, dotted option names, errors with lines."""

from __future__ import annotations

import pytest

from engine.jobconfig import ConfigError, flatten_options, lookup, parse_job_config


def test_duplicate_blocks_stay_separate_and_in_order():
    job = parse_job_config(
        "source {\n  FakeSource { row.num = 1 }\n  Other { }\n  FakeSource { row.num = 2 }\n}\n"
        "sink { Console {} }"
    )
    sources = job.section("source")
    assert [(b.index, b.name, b.line) for b in sources] == [
        (0, "FakeSource", 2),
        (1, "Other", 3),
        (2, "FakeSource", 4),
    ]
    assert lookup(sources[0].options, "row.num") == 1
    assert lookup(sources[2].options, "row.num") == 2


def test_strings_and_comments_do_not_confuse_the_block_scanner():
    job = parse_job_config(
        'source {\n  # FakeSource { } in a comment\n  FakeSource { name = "a } {" }  // x {\n}\n'
        "sink { Console { } }"
    )
    assert [b.name for b in job.section("source")] == ["FakeSource"]
    assert job.section("source")[0].options["name"] == "a } {"


def test_dotted_names_quoted_or_nested_are_the_same_option():
    assert lookup({"row": {"num": 5}}, "row.num") == 5
    assert lookup({"row.num": 6}, "row.num") == 6
    assert lookup({"a": {"b.c": 7}}, "a.b.c") == 7
    assert lookup({"row": {"x": 1}}, "row.num", "default") == "default"
    with pytest.raises(KeyError):
        lookup({"row": {"x": 1}}, "row.num")
    assert flatten_options({"row": {"num": 5}, "a.b": 1}) == {"row.num": 5, "a.b": 1}


def test_env_keys_are_flat_dotted_names():
    job = parse_job_config("env { job.name = x, job.mode = BATCH }\nsource { S {} }\nsink { K {} }")
    assert job.env == {"job.name": "x", "job.mode": "BATCH"}


def test_json_form_with_plugin_name():
    job = parse_job_config(
        '{"source": [{"plugin_name": "A", "x": 1}, {"plugin_name": "A"}],'
        ' "sink": [{"plugin_name": "K"}]}'
    )
    assert [(b.index, b.name) for b in job.section("source")] == [(0, "A"), (1, "A")]


@pytest.mark.parametrize(
    "text,path,line",
    [
        ("source {\n  A { x = [1, 2 }\n}", "config", 2),
        ("source { A {} }\nsink { K {} }\nwhat { }", "what", None),
        ("source = 3\nsink { K {} }", "source", None),
        ("env { a = ${missing} }\nsource { A {} }\nsink { K {} }", "config", 1),
    ],
)
def test_errors_name_the_path_and_line(text, path, line):
    with pytest.raises(ConfigError) as err:
        parse_job_config(text)
    first = err.value.errors[0]
    assert first["path"] == path
    if line is not None:
        assert first["line"] == line


def test_repeated_sections_keep_every_plugin():
    job = parse_job_config("source { A {} }\nsink { K { n = 1 } }\nsink { K { n = 2 } }")
    assert [(b.index, b.options) for b in job.section("sink")] == [(0, {"n": 1}), (1, {"n": 2})]


def test_a_config_wrapped_in_braces_and_json_objects_work():
    job = parse_job_config("{\n source { A { x = 1 } A { x = 2 } }\n sink { K {} }\n}")
    assert [b.options["x"] for b in job.section("source")] == [1, 2]
    job = parse_job_config('{"source": {"A": {"x": 1}, "A": {"x": 2}}, "sink": {"K": {}}}')
    assert [b.options["x"] for b in job.section("source")] == [1, 2]
