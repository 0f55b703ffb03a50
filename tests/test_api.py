"""REST API on real PostgreSQL (Django test client): auth, shapes, filters, paging, schema."""

from __future__ import annotations

import pytest
import yaml
from django.contrib.auth import get_user_model
from openapi_spec_validator import validate
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from engine.models import ClusterState, EngineEvent, MasterLease, Member, Slot
from tests.conftest import role_user

ENDPOINTS = ["/api/v1/overview", "/api/v1/members", "/api/v1/events", "/api/v1/schema"]


@pytest.fixture
def token(db):
    return Token.objects.create(user=role_user("operator", "operator")).key


@pytest.fixture
def api(token):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def make_member(name: str, state: str = "ALIVE", slots: int = 2, assigned: int = 0) -> Member:
    member = Member.objects.create(
        name=name,
        address=f"{name}:1",
        host="h",
        pid=1,
        state=state,
        slot_mode="FIXED",
        slot_count=slots,
        protocol_version=1,
    )
    for seq in range(1, slots + 1):
        Slot.objects.create(
            member=member, sequence=seq, state="ASSIGNED" if seq <= assigned else "FREE"
        )
    return member


@pytest.mark.django_db
@pytest.mark.parametrize("path", ENDPOINTS)
def test_every_endpoint_needs_authentication(path):
    client = APIClient()
    assert client.get(path).status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Token wrong")
    assert client.get(path).status_code == 401


@pytest.mark.parametrize("path", ENDPOINTS)
def test_every_endpoint_answers_with_a_token(api, path):
    assert api.get(path).status_code == 200


def test_session_login_also_works(db, client):
    role_user("op2", "viewer", password="x-Very-long-pass-2")
    assert sign_in(client, "op2", "x-Very-long-pass-2").status_code == 302
    assert client.get("/api/v1/overview").status_code == 200


def test_openapi_document_validates(api):
    response = api.get("/api/v1/schema")
    document = yaml.safe_load(response.content)
    validate(document)
    paths = document["paths"]
    for path in ("/api/v1/overview", "/api/v1/members", "/api/v1/events"):
        assert path in paths
    overview = document["components"]["schemas"]["Overview"]["properties"]
    assert {"activeMaster", "members", "totalSlot", "memberEventSequence"} <= set(overview)


def test_overview_counts_members_and_slots_of_alive_members(api):
    make_member("w1", slots=3, assigned=2)
    make_member("w2", slots=2)
    make_member("w0", state="REMOVED", slots=4, assigned=4)
    make_member("wl", state="LEFT", slots=1)
    MasterLease.objects.filter(id=1).update(epoch=7, holder="master-9")
    ClusterState.objects.filter(id=1).update(member_event_sequence=2)
    body = api.get("/api/v1/overview").json()
    assert body["members"] == {"alive": 2, "removed": 1, "left": 1}
    assert (body["totalSlot"], body["assignedSlot"], body["unassignedSlot"]) == (5, 2, 3)
    assert body["memberEventSequence"] == 2
    # The lease has no valid expiry, so nobody is active, whatever the holder column says.
    assert body["activeMaster"] is None and body["epoch"] == 7


def test_members_newest_first_with_state_filter(api):
    first = make_member("w1", slots=3, assigned=1)
    make_member("w2", state="REMOVED")
    body = api.get("/api/v1/members").json()
    assert [m["name"] for m in body] == ["w2", "w1"]
    alive = api.get("/api/v1/members?state=ALIVE").json()
    assert [m["uuid"] for m in alive] == [str(first.uuid)]
    assert alive[0]["slots"] == {"total": 3, "assigned": 1, "free": 2}
    assert set(alive[0]) >= {
        "uuid",
        "name",
        "address",
        "state",
        "slots",
        "startedAt",
        "lastHeartbeat",
    }
    bad = api.get("/api/v1/members?state=DEAD")
    assert bad.status_code == 400
    assert bad.json()["errors"][0]["path"] == "state"


def test_events_page_in_order_at_most_500(api):
    member = make_member("w1")
    EngineEvent.objects.bulk_create(
        EngineEvent(kind="test.event", member=member, payload={"i": i}) for i in range(1203)
    )
    seen, after = [], 0
    while True:
        body = api.get(f"/api/v1/events?after={after}").json()
        assert len(body["results"]) <= 500
        if not body["results"]:
            assert body["nextAfter"] == after
            break
        seen += body["results"]
        after = body["nextAfter"]
        assert after == body["results"][-1]["seq"]
    ours = [e for e in seen if e["kind"] == "test.event"]
    assert [e["payload"]["i"] for e in ours] == list(range(1203))
    assert [e["seq"] for e in seen] == sorted(e["seq"] for e in seen)
    assert ours[0]["memberUuid"] == str(member.uuid)
    assert set(ours[0]) == {"seq", "at", "kind", "jobId", "memberUuid", "epoch", "payload"}


@pytest.mark.parametrize(
    "query,path", [("after=x", "after"), ("after=-1", "after"), ("limit=501", "limit")]
)
def test_events_bad_query_names_the_field(api, query, path):
    response = api.get(f"/api/v1/events?{query}")
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == path


def test_healthz_is_public(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_dashboard_requires_login_and_renders(client, db):
    assert client.get("/").status_code == 302
    role_user("op3", "viewer", password="x-Very-long-pass-3")
    sign_in(client, "op3", "x-Very-long-pass-3")
    make_member("w1", slots=2, assigned=1)
    page = client.get("/")
    assert page.status_code == 200 and b"w1" in page.content and b"htmx" in page.content
    partial = client.get("/", HTTP_HX_REQUEST="true")
    assert partial.status_code == 200 and b"<html" not in partial.content


def test_admin_is_staff_only(client, db):
    get_user_model().objects.create_user("op4", password="x-Very-long-pass-4")
    sign_in(client, "op4", "x-Very-long-pass-4")
    assert client.get("/admin/").status_code == 302


def sign_in(client, username: str, password: str):
    """Through the login page, as a browser does (django-axes sees every attempt)."""
    return client.post("/accounts/login/", {"username": username, "password": password})


def test_failed_logins_are_rate_limited(client, db, settings):
    role_user("op5", "viewer", password="x-Very-long-pass-5")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert sign_in(client, "op5", "wrong").status_code == 200  # the form again
    assert sign_in(client, "op5", "wrong").status_code == 429  # the limit: locked out
    assert sign_in(client, "op5", "x-Very-long-pass-5").status_code == 429  # even the right one
    assert client.get("/api/v1/overview").status_code == 401  # not signed in
    # Another user from the same address is not locked out.
    role_user("op6", "viewer", password="x-Very-long-pass-6")
    assert sign_in(client, "op6", "x-Very-long-pass-6").status_code == 302
