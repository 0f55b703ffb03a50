"""Who the caller is: forwarded headers are believed only from KEEL_TRUSTED_PROXIES.

Through the real web process (``manage.py web``, daphne) with real HTTP from chosen source
addresses. Linux routes all of 127.0.0.0/8 to the loopback interface, so one host plays every
part: the web trusts 127.0.0.2 as its proxy; 127.0.0.1 and 127.0.0.3 are callers that are not
proxies; the host's own non-loopback address, where it has one, is a remote caller (the web
is bound to it, and the loopback sources reach it there as a local address). A trusted
proxy appends the address it saw to X-Forwarded-For (as nginx's ``$proxy_add_x_forwarded_for``
does), so what an untrusted caller writes is left of it and must never be reached.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import os
import re
import socket
import subprocess
import urllib.parse

import psycopg
import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.core.exceptions import ImproperlyConfigured

from engine.clientaddr import resolve
from tests.clusterkit import PYTHON, ROOT, free_port, lane_redis_url, wait_for

PROXY, CALLER, OTHER_CALLER = "127.0.0.2", "127.0.0.3", "127.0.0.1"
PASSWORD = "right-pass-123"
LIMIT = 3  # KEEL_LOGIN_FAILURE_LIMIT of the web under test


def _remote_address() -> str | None:
    """This host's address on a non-loopback interface (the one a route out uses), if any."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: a UDP connect only picks the route
        address = s.getsockname()[0]
        if not ipaddress.ip_address(address).is_loopback:
            return address
    return None


REMOTE = _remote_address()


class Web:
    """``manage.py web`` alone on a cloned database: all that answers /metrics and logins."""

    def __init__(self, database_url: str, var_dir: str, trusted: str) -> None:
        self.port = free_port()
        self.database_url = database_url
        self.log = open(os.path.join(var_dir, "web.log"), "w+b")
        env = dict(
            os.environ,
            DATABASE_URL=database_url,
            REDIS_URL=lane_redis_url("spare"),
            KEEL_VAR_DIR=var_dir,
            KEEL_PROCESS_NAME="web",
            KEEL_TRUSTED_PROXIES=trusted,
            KEEL_METRICS_LOOPBACK="1",
            KEEL_LOGIN_FAILURE_LIMIT=str(LIMIT),
        )
        # Bound to the non-loopback address where there is one: loopback sources reach it too
        # (a local address), and the web sees each caller's own source address.
        self.host = REMOTE or "127.0.0.1"
        self.proc = subprocess.Popen(
            [PYTHON, "manage.py", "web", "--host", self.host, "--port", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._answers, 60, interval=0.1, what="the web process to answer /healthz")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            self.log.seek(0)
            raise AssertionError(f"web exited {self.proc.returncode}: {self.log.read()[-2000:]}")
        with contextlib.suppress(OSError):
            return self.request("GET", "/healthz", OTHER_CALLER)[0] == 200
        return False

    def request(
        self,
        method: str,
        path: str,
        source: str,
        headers: dict[str, str] | None = None,
        body: str | None = None,
    ) -> tuple[int, dict[str, str], str]:
        """One HTTP request from ``source`` (its TCP peer address as the web sees it)."""
        conn = http.client.HTTPConnection(
            self.host, self.port, timeout=15, source_address=(source, 0)
        )
        try:
            conn.request(method, path, body, {"Host": f"127.0.0.1:{self.port}", **(headers or {})})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
        finally:
            conn.close()

    def login(self, source: str, username: str, password: str, forwarded_for: str) -> int:
        """A browser's login (the form's CSRF token and cookie): the answer's status (302 in,
        200 refused, 429 locked out)."""
        xff = {"X-Forwarded-For": forwarded_for}
        status, headers, page = self.request("GET", "/accounts/login/", source, xff)
        assert status == 200, page[:500]
        token = re.search(r"csrftoken=([^;]+)", headers["set-cookie"]).group(1)
        form = urllib.parse.urlencode(
            {"csrfmiddlewaretoken": token, "username": username, "password": password}
        )
        status, _, page = self.request(
            "POST",
            "/accounts/login/",
            source,
            {
                **xff,
                "Cookie": f"csrftoken={token}",
                "Content-Type": "application/x-www-form-urlencoded",
            },
            form,
        )
        return status

    def locked_addresses(self, username: str) -> set[str]:
        with psycopg.connect(self.database_url) as conn:
            rows = conn.execute(
                "SELECT host(ip_address) FROM axes_accessattempt WHERE username = %s", (username,)
            ).fetchall()
        return {r[0] for r in rows}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def _add_users(database_url: str, *names: str) -> None:
    """Users whose password hash is cheap to check (PBKDF2 with few rounds: the web checks it
    at those rounds), so that failed logins cost the web little."""
    encoded = PBKDF2PasswordHasher().encode(PASSWORD, "saltsaltsalt", iterations=1000)
    with psycopg.connect(database_url) as conn:
        for name in names:
            conn.execute(
                "INSERT INTO auth_user (username, password, is_superuser, is_staff, is_active,"
                " first_name, last_name, email, date_joined)"
                " VALUES (%s, %s, false, false, true, '', '', '', now())",
                (name, encoded),
            )


pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def web(db_template, tmp_path_factory):
    database_url = f"{db_template.server_url}/{db_template.clone()}"
    _add_users(database_url, "alice", "bob", "carol")
    server = Web(database_url, str(tmp_path_factory.mktemp("web")), trusted=f"{PROXY}/32")
    yield server
    server.stop()


@pytest.mark.skipif(REMOTE is None, reason="this host has no non-loopback address")
def test_a_remote_caller_cannot_claim_loopback_for_metrics(web):
    status, _, body = web.request("GET", "/metrics", REMOTE, {"X-Forwarded-For": "127.0.0.1"})
    assert status == 401, body[:300]
    status, _, _ = web.request("GET", "/metrics", REMOTE, {"X-Forwarded-For": "127.0.0.1, ::1"})
    assert status == 401


def test_metrics_believe_forwarded_addresses_only_as_far_as_trusted_proxies_wrote_them(web):
    # Through the trusted proxy, a client that claimed loopback is the address the proxy saw.
    claimed = {"X-Forwarded-For": "127.0.0.1, 198.51.100.7"}
    status, _, body = web.request("GET", "/metrics", PROXY, claimed)
    assert status == 401, body[:300]
    # The proxy forwarding for a local client: that client is local.
    status, _, _ = web.request("GET", "/metrics", PROXY, {"X-Forwarded-For": "127.0.0.1"})
    assert status == 200
    # A caller that is no proxy is who it is, whatever it writes.
    status, _, _ = web.request("GET", "/metrics", CALLER, {"X-Forwarded-For": "198.51.100.7"})
    assert status == 200
    # The proxy forwarding no client (no header, or one that is no address): nobody is local.
    for headers in ({}, {"X-Forwarded-For": "unknown"}):
        status, _, _ = web.request("GET", "/metrics", PROXY, headers)
        assert status == 401, headers


def fail_until_locked(web, source: str, username: str, forwarded_for: list[str]) -> None:
    """Failed logins, one per X-Forwarded-For value: refused until the limit, whose failure is
    answered with the lockout (429)."""
    assert len(forwarded_for) == LIMIT
    for n, value in enumerate(forwarded_for, start=1):
        assert web.login(source, username, "wrong", value) == (429 if n == LIMIT else 200), n


def test_rotating_x_forwarded_for_does_not_reset_the_login_lockout(web):
    """An untrusted caller failing with a new X-Forwarded-For each time is still one address:
    locked out at the limit, and then refused even with the right password."""
    fail_until_locked(web, CALLER, "alice", [f"203.0.113.{n}" for n in range(LIMIT)])
    assert web.login(CALLER, "alice", PASSWORD, "203.0.113.99") == 429
    assert web.locked_addresses("alice") == {CALLER}
    # The lockout is that caller's: another address logs in as alice.
    assert web.login(OTHER_CALLER, "alice", PASSWORD, "203.0.113.99") == 302


def test_behind_a_trusted_proxy_the_lockout_is_the_forwarded_clients(web):
    """Behind the proxy, what the client wrote left of the proxy's entry changes nothing; each
    client the proxy names has its own count."""
    fail_until_locked(web, PROXY, "bob", [f"10.9.9.{n}, 198.51.100.20" for n in range(LIMIT)])
    assert web.login(PROXY, "bob", PASSWORD, "10.9.9.77, 198.51.100.20") == 429
    assert web.locked_addresses("bob") == {"198.51.100.20"}
    assert web.login(PROXY, "bob", PASSWORD, "198.51.100.21") == 302


@pytest.mark.skipif(REMOTE is None, reason="this host has no non-loopback address")
def test_a_remote_caller_rotating_x_forwarded_for_is_locked_out(web):
    fail_until_locked(web, REMOTE, "carol", [f"127.0.0.{n + 10}" for n in range(LIMIT)])
    assert web.login(REMOTE, "carol", PASSWORD, "127.0.0.1") == 429
    assert web.locked_addresses("carol") == {REMOTE}


TRUSTED = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8")]


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("203.0.113.5", "127.0.0.1", "203.0.113.5"),  # not a proxy: its header is ignored
        ("10.0.0.1", "", "10.0.0.1"),  # a proxy's own request
        ("10.0.0.1", "198.51.100.7", "198.51.100.7"),
        ("10.0.0.1", "127.0.0.1, 198.51.100.7", "198.51.100.7"),  # spoof left of the proxy
        ("10.0.0.1", "198.51.100.7, 10.2.3.4", "198.51.100.7"),  # two proxies
        ("10.0.0.1", "10.5.5.5, 10.2.3.4", "10.5.5.5"),  # all trusted: the first hop
        ("10.0.0.1", "garbage, 10.2.3.4", "10.2.3.4"),  # a proxy wrote no address: stop there
        ("10.0.0.1", "198.51.100.7:4711", "198.51.100.7"),  # with a port
        ("10.0.0.1", "[2001:db8::1]:443", "2001:db8::1"),
        ("fd00::1", "2001:db8::2", "2001:db8::2"),
        ("::ffff:10.0.0.1", "198.51.100.9", "198.51.100.9"),  # IPv4-mapped peer
        ("", "198.51.100.7", ""),  # no peer address (a unix socket): nothing to believe
    ],
)
def test_the_resolver_walks_right_to_left_through_trusted_proxies(peer, forwarded, client):
    assert resolve(peer, forwarded, TRUSTED) == client


def test_a_bad_trusted_proxy_entry_is_refused_at_startup_naming_the_key(monkeypatch):
    from keel import settings as keel_settings

    monkeypatch.setenv("KEEL_TRUSTED_PROXIES", "10.0.0.1, 10.0.0.0/33")
    with pytest.raises(ImproperlyConfigured, match=r"KEEL_TRUSTED_PROXIES: '10\.0\.0\.0/33'"):
        keel_settings._networks("KEEL_TRUSTED_PROXIES")
    monkeypatch.setenv("KEEL_TRUSTED_PROXIES", " 10.0.0.1 ,fd00::/8")
    assert [str(n) for n in keel_settings._networks("KEEL_TRUSTED_PROXIES")] == [
        "10.0.0.1/32",
        "fd00::/8",
    ]
