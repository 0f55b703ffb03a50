"""Real local clusters for tests and benchmarks: each in its own database, Redis db and port.

A cluster runs the user's own commands (``./run cluster up``, ``start``, ``down``) against a
database cloned from a migrated template. By default they run in one control process per
cluster (devcluster.control), which forks masters and workers from a set-up interpreter; a
cluster made with ``fresh=True`` runs every command through ``./run`` and starts every process
as a fresh interpreter, the shipped path. Helpers poll with a deadline; nothing here sleeps to
synchronise.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import redis

from devcluster.forkserver import read_answer
from devcluster.processes import ProcessFiles

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
RUN = str(ROOT / "run")
SERVER_URL = os.environ.get("KEEL_TEST_SERVER_URL", "postgres://127.0.0.1:5432")
REDIS_BASE = os.environ.get("KEEL_TEST_REDIS_URL", "redis://127.0.0.1:6379")
T = TypeVar("T")

#: This test process's lane when pytest-xdist runs lanes side by side (0 when it does not), and
#: how many there are. Lanes share the machine's PostgreSQL (every database name carries the
#: pid) and its Redis, whose 16 numbered databases are split between them: a lane's own for
#: the test process (its number), a spare one (15 minus it), and a share of the rest for its
#: clusters, each cluster the next of its share in turn.
LANES = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
LANE = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")) % LANES
MAX_LANES = 3  # each then has 3 databases for its clusters at least (a module's and a test's)
assert LANES <= MAX_LANES, f"at most {MAX_LANES} test lanes share one Redis (-n {LANES} given)"
_SHARED = set(range(LANES)) | {15 - lane for lane in range(LANES)}
_CLUSTER_DBS = [db for db in range(16) if db not in _SHARED][LANE::LANES]


def lane_redis_url(use: str) -> str:
    """The Redis database of this lane for ``use``: "tests" (the test process's own
    channel layer and broker), "spare" (one web or demo started outside a cluster at a time)
    or "cluster" (each cluster its own, in turn from the lane's share)."""
    if use == "tests":
        return f"{REDIS_BASE}/{LANE}"
    if use == "spare":
        return f"{REDIS_BASE}/{15 - LANE}"
    return f"{REDIS_BASE}/{next(_redis_db)}"


def wait_for(
    predicate: Callable[[], T], timeout: float, interval: float = 0.01, what: str = "condition"
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_for_api(
    predicate: Callable[[], T], timeout: float, interval: float = 0.1, what: str = "condition"
) -> T:
    """``wait_for`` for a predicate that asks the web process: every 0.1 s, so that the waiting
    does not keep the web busy on one of the machine's cores while the engine works."""
    return wait_for(predicate, timeout, interval=interval, what=what)


def holds_for(predicate: Callable[[], object], seconds: float, what: str) -> None:
    """Watch ``predicate`` every 50 ms for ``seconds`` (a fault's duration): it must stay true
    throughout."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), f"{what} stopped holding"
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def admin_conn(server_url: str = SERVER_URL) -> psycopg.Connection:
    return psycopg.connect(f"{server_url}/postgres", autocommit=True)


class DatabaseTemplate:
    """A migrated database that clusters clone (``CREATE DATABASE ... TEMPLATE``): fast."""

    def __init__(self, server_url: str = SERVER_URL) -> None:
        self.server_url = server_url
        self.name = f"keel_tpl_{os.getpid()}"
        self._counter = itertools.count(1)
        with admin_conn(server_url) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.name}"')
        env = dict(os.environ, DATABASE_URL=f"{server_url}/{self.name}")
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
        )
        self.clones: list[str] = []

    def clone(self) -> str:
        name = f"keel_c_{os.getpid()}_{next(self._counter)}"
        with admin_conn(self.server_url) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.name}"')
        self.clones.append(name)
        return name

    def drop_all(self) -> None:
        with admin_conn(self.server_url) as conn:
            for name in [*self.clones, self.name]:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_redis_db = itertools.cycle(_CLUSTER_DBS)


def _json_or_text(body: bytes) -> Any:
    """The answer's JSON; an answer that is not JSON (a server error page) as its text, so
    that a test fails on the status and shows what came back."""
    try:
        return json.loads(body)
    except ValueError:
        return {"notJson": body.decode(errors="replace")[:2000]}


class Cluster:
    """One running local cluster and the ways a test looks at and hurts it."""

    def __init__(
        self,
        template: DatabaseTemplate,
        *,
        masters: int = 2,
        workers: int = 2,
        slots: int = 8,
        heartbeat_timeout: float = 3.0,
        extra_args: tuple[str, ...] = (),
        redis_url: str | None = None,
        fresh: bool = False,
    ) -> None:
        self.db_name = template.clone()
        self.database_url = f"{template.server_url}/{self.db_name}"
        self.redis_url = redis_url or lane_redis_url("cluster")
        redis.Redis.from_url(self.redis_url).flushdb()
        self.port = free_port()
        self.var_dir = Path(tempfile.mkdtemp(prefix="keel-cluster-"))
        if os.environ.get("KEEL_TEST_KEEP_CLUSTERS") != "1":  # gone when the tests end
            atexit.register(shutil.rmtree, self.var_dir, ignore_errors=True)
        self.masters, self.workers, self.slots = masters, workers, slots
        self.heartbeat_timeout = heartbeat_timeout
        self.env = dict(
            os.environ,
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis_url,
            KEEL_VAR_DIR=str(self.var_dir),
        )
        self.up_args = (
            "--masters",
            str(masters),
            "--workers",
            str(workers),
            "--slots",
            str(slots),
            "--heartbeat-timeout",
            str(heartbeat_timeout),
            "--port",
            str(self.port),
            *extra_args,
        )
        self._db: psycopg.Connection | None = None
        self.fresh = fresh
        self._control: Control | None = None

    # -- commands (the user's interface) -----------------------------------------------------

    def run(
        self, *args: str, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess:
        """``./run ARGS``; a ``cluster`` command runs in the cluster's control process unless
        the cluster is ``fresh``."""
        if args[:1] != ("cluster",) or self.fresh:
            return self.cli(*args, check=check, timeout=timeout)
        if self._control is None or not self._control.serves(self.env):
            if self._control is not None:
                self._control.close()
            self._control = Control(self.env)
        return self._checked(args, self._control.call(list(args), timeout), check)

    def cli(
        self, *args: str, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess:
        """``./run ARGS`` as a user types it: a fresh interpreter, whatever the cluster."""
        proc = subprocess.run(
            [RUN, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        return self._checked(args, proc, check)

    @staticmethod
    def _checked(
        args: tuple[str, ...], proc: subprocess.CompletedProcess, check: bool
    ) -> subprocess.CompletedProcess:
        if check and proc.returncode != 0:
            raise AssertionError(
                f"./run {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def up(self) -> Cluster:
        self.run("cluster", "up", *self.up_args)
        return self

    def __enter__(self) -> Cluster:
        """``with Cluster(...) as c``: up, and down again whatever happens (also if up fails
        half way)."""
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc) -> None:
        self.down()

    def down(self) -> None:
        """The test is over: a ``fresh`` cluster goes down as a user takes it down (``./run
        cluster down``: workers leave, masters hand over); the kit's own clusters are killed
        at once, each process with its session (a graceful leave costs seconds a cluster, and
        the tests of leaving do it themselves). Nothing of ours outlives the test."""
        pids = self.pids()
        if self.fresh:
            with contextlib.suppress(Exception):
                self.run("cluster", "down", check=False, timeout=60)
        for pid in pids.values():
            if pid and pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # each is its session's leader (setsid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._db is not None:
            self._db.close()

    def status(self) -> list[dict]:
        return json.loads(self.run("cluster", "status").stdout)

    def start(self, name: str) -> None:
        self.run("cluster", "start", name)

    # -- direct access -----------------------------------------------------------------------

    def pids(self) -> dict[str, int | None]:
        """Each process's pid, None for one whose pid file names a process that has ended
        (its pid may be another's by now: another lane's, a database backend)."""
        files = ProcessFiles(self.var_dir / "cluster")
        return {path.stem: files.pid(path.stem) for path in files.dir.glob("*.pid")}

    def pid(self, name: str) -> int:
        pid = self.pids()[name]
        if pid is None:
            raise ProcessLookupError(f"{name} is not running")
        return pid

    def signal(self, name: str, signum: int) -> int:
        """Send ``signum``; a SIGKILL returns once the process is gone (the kernel takes a
        moment), so that a ``restore()`` right after it starts the process again."""
        pid = self.pid(name)
        os.kill(pid, signum)
        if signum == signal.SIGKILL:
            wait_for(lambda: not pid_alive(pid), 10, interval=0.01, what=f"{name} to die")
        return pid

    def alive(self, name: str) -> bool:
        pid = self.pids().get(name)
        return bool(pid) and pid_alive(pid)

    def log(self, name: str) -> str:
        return (self.var_dir / "cluster" / f"{name}.log").read_text(errors="replace")

    @property
    def db(self) -> psycopg.Connection:
        if self._db is None or self._db.closed:
            self._db = psycopg.connect(self.database_url, autocommit=True)
        return self._db

    def query(self, sql: str, params: Any = None) -> list[tuple]:
        return self.db.execute(sql, params).fetchall()

    def one(self, sql: str, params: Any = None) -> Any:
        row = self.db.execute(sql, params).fetchone()
        return row[0] if row and len(row) == 1 else row

    def lease(self) -> tuple[int, str, bool]:
        """(epoch, holder, lease valid now)."""
        return self.db.execute(
            "SELECT epoch, holder, expires_at > now() FROM engine_masterlease WHERE id = 1"
        ).fetchone()

    def active_master(self) -> tuple[int, str] | None:
        epoch, holder, valid = self.lease()
        return (epoch, holder) if holder and valid else None

    def checkpoints_completed(self, job_id: int) -> int:
        return self.one(
            "SELECT sum(checkpoints_completed) FROM engine_pipeline WHERE job_id = %s", (job_id,)
        )

    def newest_completed_cut(self, job_id: int) -> tuple[int, int, int]:
        """(rows read up to the job's newest COMPLETED checkpoint: the sum of its readers'
        split offsets; how many readers acked it; how many recorded committing it)."""
        acks = self.query(
            """
            SELECT a.state, a.committed_at IS NOT NULL
              FROM engine_taskcheckpoint a JOIN engine_taskgroup g ON g.id = a.task_group_id
             WHERE g.kind = 'READER' AND a.checkpoint_id = (
                   SELECT max(id) FROM engine_checkpoint
                    WHERE job_id = %s AND state = 'COMPLETED')
            """,
            (job_id,),
        )
        states = [json.loads(s) if isinstance(s, str) else s for s, _ in acks]
        cut = sum(p["offset"] for state in states for p in state["splits"].values())
        return cut, len(acks), sum(1 for _, committed in acks if committed)

    def alive_members(self) -> int:
        return self.one("SELECT count(*) FROM engine_member WHERE state = 'ALIVE'")

    def member_event_sequence(self) -> int:
        return self.one("SELECT member_event_sequence FROM engine_clusterstate WHERE id = 1")

    @property
    def token(self) -> str:
        return (self.var_dir / "api-token").read_text().strip()

    def api(self, path: str, token: str | None = None, anonymous: bool = False) -> tuple[int, Any]:
        """GET ``path``; with the admin token unless ``token`` is given or ``anonymous``."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if token is None and not anonymous:
            token = self.token
        if token:
            request.add_header("Authorization", f"Token {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                body = resp.read()
                status = resp.status
        except urllib.error.HTTPError as exc:
            body, status = exc.read(), exc.code
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body.decode(errors="replace")

    def post(
        self, path: str, body: dict | None = None, token: str | None = None, timeout: float = 30
    ) -> tuple[int, Any]:
        """POST JSON to ``path`` with the admin token unless ``token`` is given."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            method="POST",
            data=json.dumps(body or {}).encode(),
            headers={
                "Authorization": f"Token {token or self.token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                return resp.status, _json_or_text(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _json_or_text(exc.read())

    def restore(self) -> None:
        """Start every process of the cluster that is not running (between destructive tests),
        all in one command so that their start-ups overlap; nothing to start costs nothing."""
        spec = json.loads((self.var_dir / "cluster" / "cluster.json").read_text())
        pids = self.pids()
        dead = [
            proc["name"]
            for proc in spec["processes"]
            if not (pids.get(proc["name"]) and pid_alive(pids[proc["name"]]))
        ]
        if dead:
            self.run("cluster", "start", *dead)


class Control:
    """The client of a cluster's control process (devcluster.control)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "devcluster.control"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # its own complaints go to the test's output
            start_new_session=True,
        )
        self._read(120)

    def serves(self, env: dict[str, str]) -> bool:
        """Alive, and started with ``env``: its settings (and its fork server's) were read from
        the environment once, so a changed one needs a new control process."""
        return self.proc.poll() is None and env == self.env

    def call(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"argv": argv}).encode() + b"\n")
        self.proc.stdin.flush()
        answer = self._read(timeout)
        return subprocess.CompletedProcess(
            ["./run", *argv], answer["rc"], answer["stdout"], answer["stderr"]
        )

    def _read(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        answer = read_answer(self.proc.stdout, timeout)
        if answer is None:
            self.close()
            raise AssertionError(f"the cluster's control process gave no answer in {timeout}s")
        return answer

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # it ends, and its fork server with it
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def run_batch_job(cluster: Cluster, config: str, what: str, timeout: float = 300) -> int:
    """Submit a batch job through the API and wait until it has FINISHED; its id."""
    code, body = cluster.post("/api/v1/jobs", {"config": config})
    assert code == 201, body
    job_id = body["jobId"]
    wait_for(
        lambda: cluster.one(
            "SELECT status IN ('FINISHED', 'FAILED', 'CANCELED') FROM engine_job WHERE id = %s",
            (job_id,),
        ),
        timeout,
        interval=0.2,
        what=f"{what} to end",
    )
    status, error = cluster.query(
        "SELECT status, error_msg FROM engine_job WHERE id = %s", (job_id,)
    )[0]
    assert status == "FINISHED", f"{what} ended {status}: {error}"
    return job_id


def reader_rates(cluster: Cluster, job_id: int, rows: int) -> tuple[float, float]:
    """A one-reader job's rows per wall-clock second and per CPU second of its data plane, as
    the reader's runtime thread measured them."""
    received, busy, cpu = cluster.db.execute(
        "SELECT source_received, busy_seconds, cpu_seconds FROM engine_taskgroup "
        "WHERE job_id = %s AND kind = 'READER'",
        (job_id,),
    ).fetchone()
    assert received == rows
    return received / busy, received / cpu


def pid_alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or going while being read
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
