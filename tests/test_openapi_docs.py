"""The API's Swagger UI at /api/v1/docs: allowed as every endpoint is (a session with the viewer
role; a browser without one is sent to the login page), and built only from this site's own
URLs: its scripts, style and icon are static files of drf-spectacular-sidecar, its page script
comes from the view itself, its document is /api/v1/schema."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from rest_framework.test import APIClient

from tests.conftest import role_user

pytestmark = pytest.mark.django_db

DOCS = "/api/v1/docs"


def referenced(html: str) -> list[str]:
    """The URLs a page loads: its scripts, styles and icons."""
    return re.findall(r'(?:src|href)="([^"]+)"', html)


def test_a_viewer_gets_swagger_ui_built_from_this_sites_own_urls(client):
    client.force_login(role_user("docs-viewer", "viewer"))
    page = client.get(DOCS)
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    assert not re.search(r"https?://|//[a-z]", html), "a URL of another host"
    urls = referenced(html)
    static = [u for u in urls if u.startswith("/static/")]
    assert all(u in static or u.startswith(f"{DOCS}?") for u in urls), urls
    names = {u.rsplit("/", 1)[-1] for u in static}
    assert {"swagger-ui.css", "swagger-ui-bundle.js", "favicon-32x32.png"} <= names
    assert "swagger-ui-standalone-preset.js" in names
    for url in static:  # each is a static file the finders serve (runserver, collectstatic)
        path = url.split("/static/", 1)[1]
        assert finders.find(path), url
    # The page script (not inline) is the view's own, and loads the schema from this site.
    (script,) = re.findall(r'<script src="([^"]*\?[^"]*script[^"]*)"', html)
    assert script.startswith(f"{DOCS}?")
    js = client.get(script.replace("&amp;", "&"))
    assert js.status_code == 200 and js["Content-Type"].startswith("application/javascript")
    body = js.content.decode()
    assert 'url: "/api/v1/schema"' in body and not re.search(r"https?://", body)
    assert client.get("/api/v1/schema").status_code == 200


def test_without_a_session_the_docs_send_a_browser_to_the_login_page(client):
    page = client.get(DOCS)
    assert page.status_code == 302
    assert page["Location"] == f"{settings.LOGIN_URL}?next={DOCS}"


def test_a_wrong_token_or_a_user_without_a_role_is_refused():
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Token wrong")
    assert api.get(DOCS).status_code == 401
    nobody = get_user_model().objects.create_user("docs-nobody", password="x-Very-long-pass-9")
    api = APIClient()
    api.force_authenticate(nobody)
    assert api.get(DOCS).status_code == 403
    assert api.get("/api/v1/schema").status_code == 403
