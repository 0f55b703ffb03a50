"""Job submission over REST on real PostgreSQL: planning, validation errors with paths, fuzz."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from engine.models import Job, Pipeline, TaskGroup

GOOD = """
env {
  job.name = "two chains"
  parallelism = 2
}
source {
  FakeSource { plugin_output = a, row.num = 10, split.num = 4 }
  FakeSource { plugin_output = b, "row.num" = 5 }
}
transform {
  FieldMapper { plugin_input = a, plugin_output = a2, field_mapper { id = key, name = label } }
}
sink {
  Console { plugin_input = a2 }
  Blackhole { plugin_input = b }
}
"""


def submit(api, config, **extra):
    return api.post("/api/v1/jobs", {"config": config, **extra}, format="json")


def test_duplicate_plugin_blocks_are_separate_instances_and_chains_are_pipelines(api):
    response = submit(api, GOOD)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["jobName"] == "two chains" and body["jobStatus"] == "PENDING"
    job = Job.objects.get(id=body["jobId"])
    pipelines = list(Pipeline.objects.filter(job=job).order_by("index"))
    assert len(pipelines) == 2
    assert pipelines[0].plan["source"]["config"]["row.num"] == 10
    assert pipelines[0].plan["source"]["config"]["split.num"] == 4
    assert pipelines[1].plan["source"]["config"]["row.num"] == 5  # quoted dotted key, same option
    assert [s["plugin"] for s in pipelines[0].plan["sinks"]] == ["Console"]
    assert [s["plugin"] for s in pipelines[1].plan["sinks"]] == ["Blackhole"]
    assert pipelines[0].plan["transforms"][0]["schema"] == [["key", "bigint"], ["label", "string"]]
    # One enumerator plus `parallelism` readers per pipeline, each needing a slot.
    assert TaskGroup.objects.filter(job=job).count() == 6 and job.slots_needed == 6

    detail = api.get(f"/api/v1/jobs/{job.id}").json()
    assert detail["envOptions"]["parallelism"] == 2
    assert [p["pipelineId"] for p in detail["pipelines"]] == [1, 2]
    kinds = [(t["kind"], t["index"]) for t in detail["pipelines"][0]["taskGroups"]]
    assert kinds == [("ENUMERATOR", 0), ("READER", 0), ("READER", 1)]
    listed = api.get("/api/v1/jobs?jobStatus=PENDING").json()
    assert listed["count"] == 1 and listed["results"][0]["jobId"] == job.id
    assert set(listed) == {"count", "next", "previous", "results"}


def test_job_name_from_request_wins(api):
    body = submit(api, GOOD, jobName="named").json()
    assert body["jobName"] == "named"


def test_json_config_in_seatunnel_form(api):
    config = (
        '{"env": {"job.mode": "BATCH"}, "source": [{"plugin_name": "FakeSource", '
        '"row.num": 3}, {"plugin_name": "FakeSource", "row.num": 4, '
        '"plugin_output": "x"}], "sink": [{"plugin_name": "Console"}]}'
    )
    response = submit(api, config)
    # The unnamed sink consumes the unnamed source's stream (SeaTunnel's default name): x goes
    # nowhere.
    assert response.status_code == 400
    paths = [e["path"] for e in response.json()["errors"]]
    assert paths == ["source[1].FakeSource"]


@pytest.mark.parametrize(
    "config,path,fragment",
    [
        ("source { FakeSource { row.num = 3 }\nsink { Console {} }", "config", "line"),
        ("source { Nope { } }\nsink { Console { } }", "source[0].Nope", "unknown source plugin"),
        (
            "source { FakeSource { row.num = many } }\nsink { Console {} }",
            "source[0].FakeSource.row.num",
            "integer",
        ),
        (
            "source { FakeSource { bogus = 1 } }\nsink { Console {} }",
            "source[0].FakeSource.bogus",
            "unknown option",
        ),
        (
            "source { FakeSource {} }\nsink { Console { limit = -2 } }",
            "sink[0].Console.limit",
            "at least",
        ),
        (
            "source { FakeSource {} }\ntransform { FieldMapper {} }\nsink { Console {} }",
            "transform[0].FieldMapper.field_mapper",
            "required",
        ),
        (
            "source { FakeSource { plugin_output = a }\nFakeSource { plugin_output = c } }\n"
            "sink { Console { plugin_input = b } }",
            "sink[0].Console.plugin_input",
            "produces 'b'",
        ),
        (
            "env { job.mode = SOMETIMES }\nsource { FakeSource {} }\nsink { Console {} }",
            "env.job.mode",
            "one of",
        ),
        (
            "env { parallelism = 0 }\nsource { FakeSource {} }\nsink { Console {} }",
            "env.parallelism",
            "at least",
        ),
        ("source { FakeSource {} }", "sink", "required"),
        ("", "config", "blank"),
    ],
)
def test_bad_configs_get_400_naming_the_path(api, config, path, fragment):
    response = (
        submit(api, config) if config else api.post("/api/v1/jobs", {"config": ""}, format="json")
    )
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert any(e["path"] == path and fragment in e["message"] for e in errors), errors
    assert not Job.objects.exists()


def test_syntax_error_reports_the_line(api):
    config = "env {\n  parallelism = 1\n}\nsource {\n  FakeSource { row.num = [1, 2 }\n}\n"
    errors = submit(api, config).json()["errors"]
    assert errors[0]["path"] == "config" and errors[0]["line"] == 5


def test_cancel_a_pending_job_and_cancel_again_is_409(api):
    job_id = submit(api, GOOD).json()["jobId"]
    response = api.post(f"/api/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202 and response.json()["jobStatus"] == "CANCELED"
    assert api.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 409
    assert api.post("/api/v1/jobs/999999/cancel").status_code == 404
    assert api.get("/api/v1/jobs/999999").status_code == 404
    assert api.get("/api/v1/jobs/999999/checkpoints").status_code == 404
    assert api.get(f"/api/v1/jobs/{job_id}/checkpoints").json() == []


def test_jobs_need_authentication(db):
    client = APIClient()
    assert client.get("/api/v1/jobs").status_code == 401
    assert client.get("/api/v1/jobs/1/checkpoints").status_code == 401
    assert client.post("/api/v1/jobs", {"config": GOOD}, format="json").status_code == 401


hocon_chars = st.sampled_from(
    [
        *list("{}[]=:,.\"'#/\n "),
        "source",
        "sink",
        "transform",
        "env",
        "FakeSource",
        "Console",
        "row.num",
        "plugin_input",
        "${x}",
        '"""',
        "1",
        "-",
        "true",
        "null",
        "\\",
    ]
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.one_of(
        st.text(max_size=200),
        st.lists(hocon_chars, max_size=60).map("".join),
        st.builds(
            lambda a, b: GOOD[:a] + b + GOOD[a:],
            st.integers(0, len(GOOD)),
            st.lists(hocon_chars, max_size=5).map("".join),
        ),
    )
)
def test_fuzzed_configs_never_produce_a_500(api, config):
    response = api.post("/api/v1/jobs", {"config": config}, format="json")
    assert response.status_code in (201, 400), response.content[:500]
    if response.status_code == 400:
        body = response.json()
        assert body["errors"] and all("path" in e and "message" in e for e in body["errors"])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=10,
    )
)
def test_fuzzed_request_bodies_never_produce_a_500(api, body):
    response = api.post("/api/v1/jobs", body, format="json")
    assert response.status_code in (201, 400)


def test_plans_keep_the_order_of_mappings_and_schema_fields(api):
    """jsonb would sort keys; plans must keep the user's order (columns, mappings)."""
    config = """
        source { FakeSource { schema { fields { zeta = string, id = bigint, amount = double } } } }
        transform { FieldMapper { field_mapper { zeta = z, amount = a, id = i } } }
        sink { Console { } }
    """
    job_id = submit(api, config).json()["jobId"]
    plan = Pipeline.objects.get(job_id=job_id).plan
    assert list(plan["source"]["config"]["schema"]["fields"]) == ["zeta", "id", "amount"]
    assert list(plan["transforms"][0]["config"]["field_mapper"]) == ["zeta", "amount", "id"]
    assert plan["transforms"][0]["schema"] == [["z", "string"], ["a", "double"], ["i", "bigint"]]
