"""The API's documentation as a page: Swagger UI over /api/v1/schema, its scripts, style and
icon served by this site (drf-spectacular-sidecar), nothing from another host."""

from __future__ import annotations

from django.contrib.auth.views import redirect_to_login
from drf_spectacular.views import SpectacularSwaggerSplitView
from rest_framework.exceptions import NotAuthenticated


class ApiDocsView(SpectacularSwaggerSplitView):
    """Swagger UI, allowed as the schema and every endpoint are (signed in, the viewer role:
    SPECTACULAR_SETTINGS' SERVE_PERMISSIONS). Its page script comes from this view too
    (``?script``), not inline. A browser without a session is sent to the login page and
    back; a wrong token is refused as anywhere in the API."""

    url_name = "api-schema"

    def handle_exception(self, exc):
        if isinstance(exc, NotAuthenticated):
            return redirect_to_login(self.request.get_full_path())
        return super().handle_exception(exc)
