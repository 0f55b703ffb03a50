"""The REST API as the command line uses it (``./run submit``, ``./run jobs``): every call
carries a token, so roles apply and the job records who submitted or canceled it."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

#: Seconds one HTTP call may take (a submit plans the job, which may ask a worker).
CALL_TIMEOUT = 60.0


class ApiError(CommandError):
    """The API refused a call (4xx/5xx): its status and the message it gave."""

    def __init__(self, status: int, body: Any, what: str) -> None:
        self.status, self.body = status, body
        detail = body.get("detail") if isinstance(body, dict) else None
        super().__init__(f"{what} refused ({status}): {detail or body}", returncode=2)


def _local_port(var_dir: Path) -> int | None:
    """The web port of the local cluster (``./run cluster up`` writes it), or None."""
    try:
        return int(json.loads((var_dir / "cluster" / "cluster.json").read_text())["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ApiClient:
    """``KEEL_API_URL`` and ``KEEL_API_TOKEN``; each defaults to the local cluster's (its web
    port and the admin token ``cluster up`` keeps in ``.var/api-token``, mode 600)."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        var_dir = Path(settings.VAR_DIR)
        url = url or os.environ.get("KEEL_API_URL", "")
        if not url:
            port = _local_port(var_dir)
            if port is None:
                raise CommandError(
                    "no API to talk to: set KEEL_API_URL, or start a local cluster with "
                    "`./run cluster up`",
                    returncode=3,
                )
            url = f"http://127.0.0.1:{port}"
        token = token or os.environ.get("KEEL_API_TOKEN", "")
        if not token:
            try:
                token = (var_dir / "api-token").read_text().strip()
            except OSError:
                raise CommandError(
                    f"no API token: set KEEL_API_TOKEN (the local cluster keeps one in "
                    f"{var_dir / 'api-token'} once `./run cluster up` ran)",
                    returncode=3,
                ) from None
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise CommandError(
                f"KEEL_API_URL {url!r}: expected http(s)://HOST[:PORT]", returncode=2
            )
        self.base = url.rstrip("/") + "/api/v1"
        self.token = token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
        """One call: (status, parsed JSON body); an unreachable API is a CommandError."""
        request = urllib.request.Request(  # noqa: S310 (the scheme is checked above: http(s))
            self.base + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={
                "Authorization": f"Token {self.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as resp:  # noqa: S310
                return resp.status, _parsed(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _parsed(exc.read())
        except (urllib.error.URLError, OSError) as exc:
            raise CommandError(
                f"the API at {self.base} does not answer: {exc}", returncode=3
            ) from None

    def expect(self, method: str, path: str, ok: int, what: str, body: dict | None = None) -> Any:
        """The body of a call that must answer ``ok``; any other status is an ApiError."""
        status, answer = self.call(method, path, body)
        if status != ok:
            raise ApiError(status, answer, what)
        return answer


def _parsed(raw: bytes) -> Any:
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        return {"detail": raw.decode(errors="replace")[:500]}


def resolve_user_path(name: str) -> Path:
    """A path as the user typed it: relative to where they typed it (``./run`` changes to the
    repository and passes the caller's directory in ``KEEL_CALLER_DIR``)."""
    path = Path(name).expanduser()
    if path.is_absolute():
        return path
    return Path(os.environ.get("KEEL_CALLER_DIR") or os.getcwd()) / path
