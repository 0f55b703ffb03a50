"""``./run cluster drain NAME``: a planned leave through the authenticated REST API (the admin's
token in ``.var/api-token``), so it is audited like any operator's drain; then, unless told not
to, follow it until the member has left."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from devcluster.localcluster import ClusterError, LocalCluster
from engine.models import Member
from engine.states import MemberState

POLL = 0.5


def _call(port: int, path: str, token: str, body: dict | None = None) -> tuple[int, dict | list]:
    """One call to the local web process (loopback only)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 (loopback http)
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, OSError) as exc:
        raise ClusterError(f"the web process does not answer on port {port}: {exc}") from None


def drain_worker(
    cluster: LocalCluster,
    name: str,
    reason: str,
    *,
    force: bool = False,
    wait: bool = True,
    timeout: float = 600.0,
    say: Callable[[str], object] = print,
) -> dict:
    """Drain the ALIVE member of worker process ``name``; returns the drain's last record."""
    spec = cluster.load_spec()
    spec.process(name)  # a clear error for a name that is not ours
    member = Member.objects.filter(name=name, state=MemberState.ALIVE).order_by("-id").first()
    if member is None:
        raise ClusterError(f"{name} has no ALIVE member (is it running? `cluster status`)")
    token_path = cluster.dir.parent / "api-token"
    try:
        token = token_path.read_text().strip()
    except FileNotFoundError:
        raise ClusterError(f"no API token at {token_path}: start the cluster with `up`") from None
    path = f"/api/v1/members/{member.uuid}/drain"
    code, body = _call(spec.port, path, token, {"reason": reason, "force": force})
    if code not in (200, 202):
        raise ClusterError(f"drain of {name} refused ({code}): {body.get('detail', body)}")
    say(f"drain of {name} ({member.uuid}) {'requested' if code == 202 else 'under way'}")
    deadline = time.monotonic() + timeout
    last = body
    while wait and last["state"] == "DRAINING":
        if time.monotonic() > deadline:
            raise ClusterError(f"{name} still draining after {timeout:.0f}s")
        time.sleep(POLL)  # polling the API between reads, with a deadline
        code, drains = _call(spec.port, path, token)
        if code != 200:
            raise ClusterError(f"reading the drain of {name} failed ({code}): {drains}")
        last = next(d for d in drains if d["requestId"] == body["requestId"])
    if last["state"] != "DRAINING":
        say(
            f"drain of {name} {last['state']}: moved {last['movedTaskGroups']} task group(s)"
            + (f"; {last['endReason']}" if last["endReason"] else "")
        )
    return last
