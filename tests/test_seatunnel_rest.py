"""SeaTunnel's REST API v2 on Keel: its paths, parameters and field names, as SeaTunnel's
documentation writes them, behind Keel's token authentication and roles."""

from __future__ import annotations

import json

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from engine.api.seatunnel_urls import READS, WRITES
from engine.models import Job
from tests.conftest import role_user

pytestmark = pytest.mark.django_db(transaction=True)

JSON_JOB = {
    "env": {"job.name": "from-seatunnel", "job.mode": "BATCH", "parallelism": 1},
    "source": [{"plugin_name": "FakeSource", "plugin_output": "fake", "row.num": 10}],
    "transform": [
        {
            "plugin_name": "FieldMapper",
            "plugin_input": ["fake"],
            "plugin_output": "mapped",
            "field_mapper": {"id": "user_id"},
        }
    ],
    "sink": [{"plugin_name": "Console", "plugin_input": ["mapped"]}],
}
HOCON_JOB = """
env { job.mode = "BATCH" }
source { FakeSource { result_table_name = "fake" } }
sink { Console { source_table_name = "fake" } }
"""


def client_for(role: str) -> APIClient:
    """A client with a Token header, as a SeaTunnel client configured with Keel's token."""
    user = role_user(f"st-{role}", role)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def post(client: APIClient, path: str, body, **query):
    text = body if isinstance(body, str) else json.dumps(body)
    suffix = "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
    return client.generic("POST", path + suffix, text, content_type="application/json")


def test_submit_read_list_and_stop_as_seatunnel_documents(engine):
    engine.add_member(slots=8)
    operator = client_for("operator")

    response = post(operator, "/submit-job", JSON_JOB, jobName="named-in-query")
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"jobId", "jobName"} and isinstance(body["jobId"], int)
    assert body["jobName"] == "named-in-query"
    hocon = post(operator, "/submit-job", HOCON_JOB, format="hocon").json()
    first = body["jobId"]

    info = operator.get(f"/job-info/{first}").json()
    assert info["jobId"] == str(first) and info["jobStatus"] == "PENDING"
    assert {"createTime", "jobDag", "metrics", "envOptions", "pluginJarsUrls"} <= set(info)
    assert info["isStartWithSavePoint"] is False and "finishedTime" not in info
    vertices = info["jobDag"]["vertexInfoMap"]
    assert [(v["vertexId"], v["type"]) for v in vertices] == [
        (1, "source"),
        (2, "transform"),
        (3, "sink"),
    ]
    assert info["jobDag"]["pipelineEdges"] == {
        "1": [
            {"inputVertexId": "1", "targetVertexId": "2"},
            {"inputVertexId": "2", "targetVertexId": "3"},
        ]
    }
    assert info["metrics"]["SourceReceivedCount"] == "0"
    assert info["metrics"]["SinkWriteCount"] == "0"
    assert operator.get(f"/running-job/{first}").json() == info  # the deprecated alias
    assert operator.get("/job-info/999999").json() == {"jobId": ""}

    running = operator.get("/running-jobs").json()
    assert [j["jobId"] for j in running] == [str(hocon["jobId"]), str(first)]
    assert set(running[0]["metrics"]) == {"sourceReceivedCount", "sinkWriteCount"}
    assert len(operator.get("/running-jobs?page=2&rows=1").json()) == 1

    stopped = post(operator, "/stop-job", {"jobId": first, "isStopWithSavePoint": False})
    assert stopped.json() == {"jobId": first}
    assert Job.objects.get(id=first).status == "CANCELED"
    both = post(operator, "/stop-jobs", [{"jobId": hocon["jobId"]}, {"jobId": first}])
    assert both.json() == [{"jobId": hocon["jobId"]}, {"jobId": first}]  # twice is done

    finished = operator.get("/finished-jobs/CANCELED").json()
    assert [j["jobId"] for j in finished] == [str(hocon["jobId"]), str(first)]
    assert {"errorMsg", "finishTime", "jobDag", "metrics"} <= set(finished[0])
    assert operator.get("/finished-jobs/FINISHED").json() == []
    assert len(operator.get("/finished-jobs").json()) == 2
    info = operator.get(f"/job-info/{first}").json()
    assert info["jobStatus"] == "CANCELED" and info["finishedTime"] and "envOptions" not in info
    assert len(info["jobDag"]["vertexInfoMap"]) == 3  # from the history now


def test_submit_jobs_is_all_or_nothing_and_answers_string_ids(engine):
    engine.add_member(slots=8)
    operator = client_for("operator")
    jobs = [
        {"params": {"jobName": "a"}, **JSON_JOB},
        {"params": {"jobName": "b"}, **JSON_JOB},
    ]
    answer = post(operator, "/submit-jobs", jobs).json()
    assert [j["jobName"] for j in answer] == ["a", "b"]
    assert all(isinstance(j["jobId"], str) for j in answer)
    bad = [jobs[0], {"params": {}, "env": {"parallelsim": 1}, **JSON_JOB}]
    bad[1]["env"] = {"parallelsim": 1}
    refused = post(operator, "/submit-jobs", bad)
    assert refused.status_code == 400
    assert refused.json()["status"] == "fail"
    assert "[1]: env.parallelsim" in refused.json()["message"]
    assert Job.objects.count() == 2  # none of the refused batch


def test_what_keel_does_not_do_is_a_clear_400_and_roles_hold(engine):
    engine.add_member(slots=8)
    operator, viewer = client_for("operator"), client_for("viewer")
    for query in ({"isStartWithSavePoint": "true"}, {"jobId": "42"}, {"format": "sql"}):
        response = post(operator, "/submit-job", JSON_JOB, **query)
        assert response.status_code == 400 and response.json()["status"] == "fail", query
    not_json = post(operator, "/submit-job", HOCON_JOB)
    assert "?format=hocon" in not_json.json()["message"]
    bad = post(operator, "/submit-job", {**JSON_JOB, "env": {"parallelism": 0}})
    assert bad.status_code == 400 and "env.parallelism" in bad.json()["message"]

    assert post(viewer, "/submit-job", JSON_JOB).status_code == 403
    assert post(viewer, "/stop-job", {"jobId": 1}).status_code == 403
    assert APIClient().get("/overview").status_code in (401, 403)
    overview = viewer.get("/overview").json()
    assert overview["works"] == "1" and overview["totalSlot"] == "8"
    assert all(isinstance(v, str) for v in overview.values())
    system = viewer.get("/system-monitoring-information").json()
    assert system[0]["processors"].isdigit() and system[0]["physical.memory.total"].endswith("G")


def test_every_seatunnel_path_needs_a_token():
    for route, _ in WRITES + READS:
        path = "/" + route.replace("<int:job_id>", "1").replace("<str:state>", "FINISHED")
        client = APIClient()
        method = client.post if route in dict(WRITES) else client.get
        assert method(path).status_code == 401, path
        client.credentials(HTTP_AUTHORIZATION="Token wrong")
        assert method(path).status_code == 401, path
