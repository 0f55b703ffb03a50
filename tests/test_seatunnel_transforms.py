"""SeaTunnel's Sql, Copy, Replace and FilterRowKind transforms, with SeaTunnel's option names,
run through the engine's data plane."""

from __future__ import annotations

import json

import pytest

from engine.jobconfig import ConfigError
from tests.localrun import run_batch

SOURCE = """source { FakeSource { plugin_output = fake, row.num = 20, split.num = 2,
  schema { fields { id = bigint, name = string, age = int, price = "decimal(8, 2)",
                    at = timestamp, tags = "array<string>", point = { x = int, y = int } } } } }"""


def run(transform: str, tmp_path, source: str = SOURCE) -> list[dict]:
    out = tmp_path / "out"
    result = run_batch(
        f"env {{ job.mode = BATCH, parallelism = 1 }}\n{source}\n"
        f"transform {{ {transform} }}\n"
        f'sink {{ LocalFile {{ plugin_input = t, path = "{out}", file_format_type = json }} }}'
    )
    assert result["warnings"] == []
    return [
        json.loads(ln)
        for p in sorted(out.glob("*.jsonl"))
        for ln in p.read_text().split("\n")
        if ln
    ]


def test_sql_selects_computes_and_filters_each_batch(tmp_path):
    rows = run(
        'Sql { plugin_input = fake, plugin_output = t, query = """select id,'
        " concat(name, '_') as name, age + 1 as age, price * 2 as price2, tags[1] as tag,"
        ' point.x as x, upper(name) as big from dual where id % 3 = 0 and age > 0""" }',
        tmp_path,
    )
    assert sorted(r["id"] for r in rows) == [3, 6, 9, 12, 15, 18]
    three = next(r for r in rows if r["id"] == 3)
    assert three == {
        "id": 3,
        "name": "name-3_",
        "age": 4,
        "price2": "3.00",
        "tag": "tags-3",
        "x": 3,
        "big": "NAME-3",
    }


def test_sql_reads_the_input_stream_by_its_name_too(tmp_path):
    rows = run(
        "Sql { source_table_name = fake, result_table_name = t,"
        ' query = "select count(*) as n, max(id) as top from fake" }',
        tmp_path,
    )
    # One answer per batch (the transform sees batches, as SeaTunnel's sees rows).
    assert sum(r["n"] for r in rows) == 20


@pytest.mark.parametrize(
    "query,message",
    [
        ("delete from dual", "must be a SELECT"),
        ("select nope from dual", 'Referenced column "nope" not found'),
        ("select * from read_csv('/etc/passwd')", "file system operations are disabled"),
        ("select 1 as a, 2 as a from dual", "names a more than once"),
        ("select 1; select 2", "one statement"),
    ],
)
def test_a_bad_query_is_a_400_that_names_it(tmp_path, query, message):
    with pytest.raises(ConfigError) as caught:
        run(f'Sql {{ plugin_input = fake, plugin_output = t, query = "{query}" }}', tmp_path)
    assert any(
        e["path"].startswith("transform[0].Sql") and message in e["message"]
        for e in caught.value.errors
    ), caught.value.errors


def test_copy_replace_and_filter_row_kind(tmp_path):
    source = """source { FakeSource { plugin_output = fake,
      schema { fields { id = int, name = string } },
      rows = [ { kind = INSERT, fields = [1, "a b c"] }, { kind = DELETE, fields = [2, "d e"] },
               { kind = UPDATE_AFTER, fields = [3, "f"] } ] } }"""
    rows = run(
        "FilterRowKind { plugin_input = fake, plugin_output = kept,"
        " exclude_kinds = [DELETE] }\n"
        "Copy { plugin_input = kept, plugin_output = copied, fields { name2 = name, id2 = id } }\n"
        'Replace { plugin_input = copied, plugin_output = t, replace_field = name2, pattern = " ",'
        ' replacement = "_", is_regex = false }',
        tmp_path,
        source,
    )
    assert rows == [
        {"id": 1, "name": "a b c", "name2": "a_b_c", "id2": 1},
        {"id": 3, "name": "f", "name2": "f", "id2": 3},
    ]


def test_replace_by_regex_first_match_only(tmp_path):
    rows = run(
        "Replace { plugin_input = fake, plugin_output = t, replace_field = name,"
        ' pattern = "([a-z]+)-", replacement = "$1=", is_regex = true, replace_first = true }',
        tmp_path,
    )
    assert {r["name"] for r in rows} >= {"name=0", "name=19"}


def test_filter_row_kind_include(tmp_path):
    source = """source { FakeSource { plugin_output = fake, schema { fields { id = int } },
      rows = [ { kind = INSERT, fields = [1] }, { kind = DELETE, fields = [2] } ] } }"""
    rows = run(
        "FilterRowKind { plugin_input = fake, plugin_output = t, include_kinds = [DELETE] }",
        tmp_path,
        source,
    )
    assert rows == [{"id": 2}]


@pytest.mark.parametrize(
    "query,message",
    [
        ("select interval 1 day as i from dual", "column i has type"),
        ("select 18446744073709551615::ubigint as u from dual", "column u has type"),
    ],
)
def test_an_answer_of_a_type_keel_lacks_is_a_400(tmp_path, query, message):
    with pytest.raises(ConfigError) as caught:
        run(f'Sql {{ plugin_input = fake, plugin_output = t, query = "{query}" }}', tmp_path)
    assert message in str(caught.value)


def test_planning_never_runs_the_query_s_work():
    from engine.jobs.planner import plan_job

    plan = plan_job(
        f"{SOURCE}\ntransform {{ Sql {{ plugin_input = fake, plugin_output = t,"
        ' query = "select count(*) as n from range(1000000000000)" } }\n'
        "sink { Blackhole { plugin_input = t } }"
    )
    assert plan.pipelines[0].transforms[0].schema == [["n", "bigint"]]


def test_a_bad_replacement_is_a_400_and_kinds_survive_copy_and_replace(tmp_path):
    with pytest.raises(ConfigError, match="replacement"):
        run(
            "Replace { plugin_input = fake, plugin_output = t, replace_field = name,"
            ' pattern = "(a)", replacement = "$2", is_regex = true }',
            tmp_path,
        )
    source = """source { FakeSource { plugin_output = fake,
      schema { fields { id = int, s = string } },
      rows = [ { kind = DELETE, fields = [1, "x"] }, { kind = INSERT, fields = [2, "y"] } ] } }"""
    rows = run(
        "Copy { plugin_input = fake, plugin_output = c, fields { s2 = s } }\n"
        'Replace { plugin_input = c, plugin_output = r, replace_field = s2, pattern = "x",'
        ' replacement = "z" }\n'
        "FilterRowKind { plugin_input = r, plugin_output = t, exclude_kinds = [DELETE] }",
        tmp_path,
        source,
    )
    assert rows == [{"id": 2, "s": "y", "s2": "y"}]
