"""API error shape: validation errors as ``{errors: [{path, message}]}``, everything else DRF's."""

from __future__ import annotations

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from engine.dbsession import session_lost


def _flatten(detail, path: str = "") -> list[dict]:
    if isinstance(detail, dict):
        out = []
        for key, value in detail.items():
            sub = str(key) if key != "non_field_errors" else ""
            out += _flatten(value, f"{path}.{sub}" if path and sub else (sub or path))
        return out
    if isinstance(detail, list):
        if all(not isinstance(d, dict | list) for d in detail):
            return [{"path": path, "message": str(d)} for d in detail]
        out = []
        for index, value in enumerate(detail):
            out += _flatten(value, f"{path}[{index}]")
        return out
    return [{"path": path, "message": str(detail)}]


def exception_handler(exc, context):
    if session_lost(exc):
        # The database went away, or ended this request's session (a lock or transaction
        # timeout, an idle transaction): nothing was committed, and the same request may
        # simply be sent again.
        return Response(
            {"detail": "the engine's database did not complete the request; retry it"},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": "1"},
        )
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.ValidationError):
        detail = exc.detail
        if isinstance(detail, dict) and set(detail) == {"errors"}:
            # Already [{path, message, line?}] (job-config errors): keep paths and lines as given.
            response.data = {
                "errors": [
                    {
                        k: (int(v) if k in ("line", "column") else str(v))
                        for k, v in e.items()
                        if v is not None
                    }
                    for e in detail["errors"]
                ]
            }
        else:
            response.data = {"errors": _flatten(detail)}
    return response
