"""The dashboard's pages filter and page through the API's FilterSets and page size: a filter
value selects the same rows on a page as in the API; a value the API refuses with a 400 naming
its parameter is dropped on the page (200, unfiltered by it)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from dashboard import live
from engine.api.pagination import PAGE_SIZE
from engine.models import Job, JobCleanupRecord
from history.models import JobHistory
from tests.conftest import role_user

pytestmark = pytest.mark.django_db


def make_jobs(*specs: tuple[str, str]) -> list[int]:
    """Jobs (name, status) as rows; their ids, in the order given."""
    jobs = Job.objects.bulk_create(
        Job(name=name, status=status, mode="BATCH", config_text="", slots_needed=1)
        for name, status in specs
    )
    return [job.id for job in jobs]


@pytest.fixture
def viewers(client):
    """(API client, dashboard client), both signed in as a viewer."""
    user = role_user("filter-viewer", "viewer")
    api = APIClient()
    api.force_authenticate(user)
    client.force_login(user)
    return api, client


def api_ids(api: APIClient, query: str) -> list[int]:
    response = api.get(f"/api/v1/jobs?{query}")
    assert response.status_code == 200, response.content
    return [job["jobId"] for job in response.json()["results"]]


def page_ids(client, query: str) -> list[int]:
    response = client.get(f"/jobs/?{query}")
    assert response.status_code == 200
    return [job.id for job in response.context["jobs"]]


def test_a_search_selects_the_same_jobs_on_the_page_and_in_the_api(viewers):
    api, client = viewers
    nightly, hourly, _ = make_jobs(
        ("nightly-orders", "RUNNING"), ("hourly-clicks", "CANCELED"), ("other", "FINISHED")
    )
    for query, expected in [
        ("q=NIGHTLY", [nightly]),
        (f"q={hourly}", [hourly]),
        ("q=ly-&jobStatus=CANCELED", [hourly]),
        ("q=%C2%B2", []),  # a digit that is no number: a name search only
        (f"q={'9' * 40}", []),  # digits past a bigint: a name search only
    ]:
        assert api_ids(api, query) == page_ids(client, query) == expected, query


@pytest.mark.parametrize(
    "param,bad",
    [("jobStatus", "NOPE"), ("evaluationStatus", "NOPE"), ("q", "x" * 101), ("q", "a\x00b")],
)
def test_a_jobs_filter_the_api_refuses_is_dropped_on_the_page(viewers, param, bad):
    api, client = viewers
    ids = make_jobs(("x" * 100, "RUNNING"), ("y", "FINISHED"))
    response = api.get("/api/v1/jobs", {param: bad})
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == param
    page = client.get("/jobs/", {param: bad})
    assert page.status_code == 200
    # The search is cut to its longest as typed on the page (what the API would take).
    expected = ids[:1] if bad == "x" * 101 else sorted(ids, reverse=True)
    assert [job.id for job in page.context["jobs"]] == expected
    assert page.context["filters"][param] == ("x" * 100 if bad == "x" * 101 else "")


@pytest.mark.parametrize("param,bad", [("state", "NOPE"), ("kind", "NOPE"), ("jobId", "abc")])
def test_a_cleanup_filter_the_api_refuses_is_dropped_on_the_page(viewers, param, bad):
    api, client = viewers
    JobCleanupRecord.objects.bulk_create(
        JobCleanupRecord(job_id=n, kind="JOB_STATE", state="PENDING", due_at="2030-01-01T00:00Z")
        for n in (1, 2)
    )
    response = api.get("/api/v1/cleanup-records", {param: bad})
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == param
    page = client.get("/cleanup/", {param: bad})
    assert page.status_code == 200 and page.context["count"] == 2
    assert page.context["filters"][param] == ""
    good = client.get("/cleanup/", {"jobId": "2", "kind": "JOB_STATE"}).context["rows"]
    listed = api.get("/api/v1/cleanup-records", {"jobId": "2", "kind": "JOB_STATE"}).json()
    assert [r.job_id for r in good] == [r["jobId"] for r in listed["results"]] == [2]


def test_the_history_and_cluster_pages_drop_a_status_or_label_they_do_not_list(viewers):
    _, client = viewers
    finished, canceled = make_jobs(("a", "FINISHED"), ("b", "CANCELED"))
    JobHistory.objects.bulk_create(
        [
            JobHistory(job_id=finished, status="FINISHED"),
            JobHistory(job_id=canceled, status="CANCELED"),
        ]
    )
    page = client.get("/history/", {"jobStatus": "CANCELED"})
    assert [h.job_id for h in page.context["rows"]] == [canceled]
    page = client.get("/history/", {"jobStatus": "RUNNING"})  # not a finished job's status
    assert page.status_code == 200 and page.context["count"] == 2 and page.context["status"] == ""
    page = client.get("/", {"recovery": "DISABLED"})
    assert {j.id for j in page.context["jobs"]} == {finished, canceled}
    page = client.get("/", {"recovery": "NOPE"})
    assert page.status_code == 200 and page.context["recovery"] == ""
    assert {j.id for j in page.context["jobs"]} == {finished, canceled}
    assert client.get("/", {"recovery": "CLEAN"}).context["jobs"].count() == 0


def test_pages_hold_as_many_rows_as_the_apis_pages(viewers):
    api, client = viewers
    ids = make_jobs(*[(f"paged-{n}", "FINISHED") for n in range(PAGE_SIZE + 1)])
    JobCleanupRecord.objects.bulk_create(
        JobCleanupRecord(job_id=n, kind="HISTORY", state="DONE", due_at="2030-01-01T00:00Z")
        for n in ids
    )
    JobHistory.objects.bulk_create(JobHistory(job_id=n, status="FINISHED") for n in ids)
    assert len(api_ids(api, "q=paged-")) == len(page_ids(client, "q=paged-")) == PAGE_SIZE
    assert api_ids(api, "q=paged-&page=2") == page_ids(client, "q=paged-&page=2") == [ids[0]]
    assert len(api.get("/api/v1/cleanup-records").json()["results"]) == PAGE_SIZE
    assert len(client.get("/cleanup/").context["rows"]) == PAGE_SIZE
    assert len(client.get("/history/").context["rows"]) == PAGE_SIZE


def test_the_live_socket_renders_the_jobs_page_through_the_same_filters():
    nightly, _ = make_jobs(("nightly", "RUNNING"), ("hourly", "RUNNING"))
    # The socket's query: the page's own parameters beside its topic and seq.
    query = {"topic": "jobs", "after": "7", "q": " nightly ", "jobStatus": "NOPE", "page": "x"}
    context = live.jobs_context(query)
    assert [job.id for job in context["jobs"]] == [nightly]
    assert context["filters"] == {
        "jobStatus": "",
        "evaluationStatus": "",
        "q": "nightly",
        "page": "1",
    }
    assert context["live_query"] == "q=nightly"
