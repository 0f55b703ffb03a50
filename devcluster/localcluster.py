"""The local cluster behind ``./run cluster``: web, masters and workers as background processes.

The cluster's shape and each process's command line live in ``.var/cluster/cluster.json``; every
process has ``<name>.pid`` and ``<name>.log`` beside it. ``up`` returns only once the web answers,
an active master exists and every worker is registered as an ALIVE member.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from devcluster.early import adopt, started_early
from devcluster.forkserver import comparable_env, read_answer
from devcluster.processes import (
    MANAGE,
    ClusterError,
    ClusterSpec,
    ProcessFiles,
    ProcessSpec,
    check_netns,
    process_env,
    process_start_time,
)
from engine import roles
from engine.models import MasterCandidate, Member
from engine.queries import overview

__all__ = ["ClusterError", "ClusterSpec", "LocalCluster", "ProcessSpec", "process_start_time"]


class ForkServer:
    """A client of ``devcluster.forkserver``, started on first use with this process's
    environment: it forks masters and workers whose environment matches it, and declines the
    rest (``spawn`` returns None), which are then started fresh."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._server: subprocess.Popen | None = None
        self._env: dict[str, str] = {}

    def spawn(self, proc: ProcessSpec, env: dict[str, str], log: Path) -> int | None:
        if proc.kind not in ("master", "worker") or proc.argv[1:2] != [MANAGE]:
            return None
        if self._server is None or self._server.poll() is not None:
            self._start(env)
        if comparable_env(env) != self._env:
            return None
        check_netns(proc.netns)
        request = {"name": proc.name, "argv": proc.argv[2:], "log": str(log), "netns": proc.netns}
        answer = self._ask(request, timeout=30)
        if "pid" not in answer:
            raise ClusterError(f"the fork server could not start {proc.name}: {answer}")
        return int(answer["pid"])

    def _start(self, env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "devcluster.forkserver"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=settings.BASE_DIR,
                start_new_session=True,
            )
        self._env = {}
        answer = self._ask(None, timeout=60)
        if "ready" not in answer:
            raise ClusterError(f"the fork server did not start: see {self.log_path}")
        self._env = comparable_env(env)

    def _ask(self, request: dict | None, timeout: float) -> dict:
        server = self._server
        assert server is not None and server.stdin and server.stdout
        try:
            if request is not None:
                server.stdin.write(json.dumps(request).encode() + b"\n")
                server.stdin.flush()
        except OSError:
            return {"error": "the fork server is gone"}
        answer = read_answer(server.stdout, timeout)
        if answer is None:
            self.close()
            return {"error": f"no answer within {timeout:.0f}s"}
        return answer

    def close(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.kill()
            self._server.wait(10)
            self._server = None


#: Set by a process that drives clusters for a long time (the tests' control process): masters
#: and workers are then forked from a set-up interpreter instead of started fresh.
fork_server: ForkServer | None = None


class LocalCluster(ProcessFiles):
    def __init__(self, directory: Path | None = None) -> None:
        super().__init__(directory or Path(settings.VAR_DIR) / "cluster")

    def spawn(self, proc: ProcessSpec) -> int:
        early = started_early().get(proc.name)
        if early is not None and self.pid(proc.name) == early and self.pid_alive(early):
            adopt(proc.name)  # this command's interpreter started it before Django was set up
            return early
        if self.alive(proc.name):
            raise ClusterError(f"{proc.name} is already running (pid {self.pid(proc.name)})")
        env = process_env(proc)
        env.setdefault("DATABASE_URL", settings.DATABASE_URL)
        env.setdefault("REDIS_URL", settings.REDIS_URL)
        env.setdefault("KEEL_VAR_DIR", str(settings.VAR_DIR))
        self.dir.mkdir(parents=True, exist_ok=True)
        pid = fork_server.spawn(proc, env, self.log_path(proc.name)) if fork_server else None
        if pid is None:
            return self.start_fresh(proc, env)
        self.record_pid(proc.name, pid)
        return pid

    def signal(self, name: str, signum: int) -> int:
        self.load_spec().process(name)
        pid = self.pid(name)
        if not self.pid_alive(pid):
            raise ClusterError(f"{name} is not running")
        os.kill(pid, signum)
        return pid

    def wait_exit(self, name: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive(name):
                return True
            time.sleep(0.05)
        return not self.alive(name)

    # -- readiness ---------------------------------------------------------------------------

    def ready(self, proc: ProcessSpec, spec: ClusterSpec) -> bool:
        pid = self.pid(proc.name)
        if proc.kind == "web":
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{spec.port}/healthz", timeout=2
                ) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, OSError):
                return False
        if proc.kind == "master":
            return MasterCandidate.objects.filter(name=proc.name, pid=pid).exists()
        return Member.objects.alive().filter(name=proc.name, pid=pid).exists()

    def has_active_master(self, spec: ClusterSpec) -> bool:
        active = overview()["activeMaster"]
        return bool(active and active["name"] in {p.name for p in spec.processes})

    def wait_ready(self, spec: ClusterSpec, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = [spec.process(n) for n in names]
        need_master = any(p.kind == "master" for p in pending)
        while True:
            for proc in list(pending):
                if not self.alive(proc.name):
                    raise ClusterError(
                        f"{proc.name} exited during start-up; see {self.log_path(proc.name)}:"
                        f" {self.last_log_line(proc.name)}"
                    )
                if self.ready(proc, spec):
                    pending.remove(proc)
            if need_master and not pending and self.has_active_master(spec):
                need_master = False
            if not pending and not need_master:
                return
            if time.monotonic() > deadline:
                waiting = [p.name for p in pending] + (["an active master"] if need_master else [])
                raise ClusterError(
                    f"cluster not ready after {timeout:.0f}s: waiting for "
                    f"{', '.join(waiting)} (logs in {self.dir})"
                )
            time.sleep(0.05)

    def last_log_line(self, name: str) -> str:
        try:
            lines = [ln for ln in self.log_path(name).read_text().splitlines() if ln.strip()]
        except FileNotFoundError:
            return "(no log)"
        return lines[-1] if lines else "(empty log)"

    # -- commands ----------------------------------------------------------------------------

    def up(self, spec: ClusterSpec, timeout: float = 90.0) -> None:
        early = started_early()
        if self.spec_path.exists():
            running = [p["name"] for p in self.status() if p["alive"] and p["name"] not in early]
            if running:
                raise ClusterError(
                    f"a cluster is already running here ({', '.join(running)}): "
                    "`./run cluster down` first"
                )
        self.save_spec(spec)
        for proc in spec.processes:
            if proc.name not in early:
                self.pid_path(proc.name).unlink(missing_ok=True)
        try:
            for proc in spec.processes:
                self.spawn(proc)
            # While they start: a new admin's password hash alone costs most of a second.
            write_api_token(Path(settings.VAR_DIR))
            self.wait_ready(spec, [p.name for p in spec.processes], timeout)
        except BaseException:
            self.down()
            raise

    def start(self, *names: str, timeout: float = 60.0) -> dict[str, int]:
        """Start the named processes together and wait until each is ready: their start-ups
        overlap, which is what a restart after a fault wants."""
        spec = self.load_spec()
        procs = [spec.process(name) for name in dict.fromkeys(names)]
        pids = {proc.name: self.spawn(proc) for proc in procs}
        self.wait_ready(spec, list(pids), timeout)
        return pids

    def down(self, timeout: float = 20.0) -> None:
        spec = self.load_spec()
        # Workers first (they leave cleanly), then masters, then the web.
        order = sorted(spec.processes, key=lambda p: {"worker": 0, "master": 1, "web": 2}[p.kind])
        for proc in order:
            pid = self.pid(proc.name)
            if self.pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in order:
            self.wait_exit(proc.name, max(deadline - time.monotonic(), 0.1))
            pid = self.pid(proc.name)
            if self.pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.wait_exit(proc.name, 5)
            self.pid_path(proc.name).unlink(missing_ok=True)


ADMIN_USERNAME = "admin"


def ensure_admin(var_dir: Path) -> tuple[str, str, str]:
    """A local admin user with a random password and an API token (both kept mode 600)."""
    user_model = get_user_model()
    password_file = var_dir / "admin-password"
    user, created = user_model.objects.get_or_create(
        username=ADMIN_USERNAME, defaults={"is_staff": True, "is_superuser": True}
    )
    if created or not password_file.exists():
        password = secrets.token_urlsafe(12)
        user.set_password(password)
        user.is_staff = user.is_superuser = True
        user.save()
        _write_private(password_file, password)
    password = password_file.read_text().strip()
    from rest_framework.authtoken.models import Token  # `cluster up` only: a full process

    token, _ = Token.objects.get_or_create(user=user)
    return ADMIN_USERNAME, password, token.key


def write_api_token(var_dir: Path) -> str:
    """The admin's token in ``api-token``, and a user and token per role beside it
    (``api-token-viewer``, ``api-token-operator``), each file mode 600."""
    _, _, key = ensure_admin(var_dir)
    _write_private(var_dir / "api-token", key)
    for role in (roles.VIEWER, roles.OPERATOR):
        _write_private(var_dir / f"api-token-{role}", ensure_role_user(role))
    return key


def ensure_role_user(role: str) -> str:
    """A local user named after ``role`` (no password: token only), in its group; its token."""
    roles.ensure_groups()
    user, created = get_user_model().objects.get_or_create(username=role)
    if created:
        user.set_unusable_password()
        user.save()
    user.groups.set([Group.objects.get(name=role)])
    from rest_framework.authtoken.models import Token  # `cluster up` only: a full process

    token, _ = Token.objects.get_or_create(user=user)
    return token.key


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text + "\n")
    os.chmod(path, 0o600)
