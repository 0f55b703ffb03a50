"""Roles on the API and the admin: a viewer reads, an operator also submits and cancels (and
the job records who did), anyone else is refused with a message naming the role; engine state
is read-only in the admin."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from engine.models import Job
from tests.conftest import role_user

CONFIG = "source { FakeSource { } }\nsink { Console { } }\n"


def client_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def viewer(db):
    return client_for(role_user("vera", "viewer"))


@pytest.fixture
def operator(db):
    return client_for(role_user("otto", "operator"))


def test_a_viewer_reads_but_may_not_submit_or_cancel(viewer, operator):
    job_id = operator.post("/api/v1/jobs", {"config": CONFIG}, format="json").json()["jobId"]
    assert viewer.get("/api/v1/jobs").status_code == 200
    assert viewer.get(f"/api/v1/jobs/{job_id}").status_code == 200
    response = viewer.post("/api/v1/jobs", {"config": CONFIG}, format="json")
    assert response.status_code == 403
    assert "engine.submit_job" in response.json()["detail"]
    assert "operator" in response.json()["detail"]
    assert viewer.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 403
    assert Job.objects.count() == 1 and Job.objects.get().status == "PENDING"


def test_an_operators_cancel_is_accepted_and_recorded_with_the_user(operator, viewer):
    response = operator.post("/api/v1/jobs", {"config": CONFIG}, format="json")
    assert response.status_code == 201
    job_id = response.json()["jobId"]
    response = operator.post(f"/api/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202
    detail = viewer.get(f"/api/v1/jobs/{job_id}").json()
    assert (detail["jobStatus"], detail["submittedBy"], detail["canceledBy"]) == (
        "CANCELED",
        "otto",
        "otto",
    )
    job = Job.objects.get(id=job_id)
    assert job.submitted_by.username == job.canceled_by.username == "otto"


def test_a_user_without_a_role_is_refused_even_reads(db):
    nobody = client_for(get_user_model().objects.create_user("nora", password="x-Very-long-9"))
    response = nobody.get("/api/v1/jobs")
    assert response.status_code == 403 and "viewer" in response.json()["detail"]
    assert APIClient().get("/api/v1/jobs").status_code == 401


def test_engine_state_is_read_only_in_the_admin(admin_client, db):
    for model in (
        "member",
        "memberdrain",
        "slot",
        "engineevent",
        "masterlease",
        "mastercandidate",
        "job",
    ):
        assert admin_client.get(f"/admin/engine/{model}/add/").status_code == 403, model
        assert admin_client.get(f"/admin/engine/{model}/").status_code == 200, model
    assert admin_client.get("/admin/engine/connection/add/").status_code == 200
