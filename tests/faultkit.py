"""Private services a fault test may stop and start (never the machine's shared ones), and
failures injected into the test database's own statements."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import redis

from devcluster.bootstrap import as_postgres_user, find_pg_program
from tests.clusterkit import free_port, wait_for


class Freezable:
    """A private server's process that a test can freeze: SIGSTOP keeps its connections open
    while nothing answers (a hung server); SIGCONT thaws it."""

    proc: subprocess.Popen | None

    def freeze(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


class PrivateRedis(Freezable):
    """A redis-server of the test's own on a free port, without persistence: stopping it loses
    whatever was queued, as a crashed broker would."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.port = free_port()
        self.address = address
        self.url = f"redis://{address}:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="keel-redis-")
        self.proc: subprocess.Popen | None = None

    def answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping())
        except (redis.RedisError, OSError):
            return False

    def start(self) -> PrivateRedis:
        server = shutil.which("redis-server")
        assert server, "redis-server is not installed"
        flags = ["--bind", *dict.fromkeys(["127.0.0.1", self.address]), "--port", str(self.port)]
        flags += ["--protected-mode", "no"]
        flags += ["--save", "", "--appendonly", "no", "--dir", self.dir]
        self.proc = subprocess.Popen(
            [server, *flags],
            stdout=subprocess.DEVNULL,
        )
        wait_for(self.answers, 10, what=f"a private Redis on port {self.port}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def refused(table: str, operation: str, condition: str = "true") -> Iterator[None]:
    """While inside: ``operation`` (INSERT, UPDATE or DELETE) on ``table`` fails where
    ``condition`` holds (SQL over the row, NEW or OLD), as a real database error would, in
    the test's database (a PostgreSQL trigger, dropped on the way out)."""
    from django.db import connection

    row = "OLD" if operation == "DELETE" else "NEW"
    with connection.cursor() as cur:
        cur.execute(
            f"""
            CREATE FUNCTION test_refused() RETURNS trigger AS $$
            BEGIN
              IF {condition} THEN RAISE EXCEPTION 'injected failure'; END IF;
              RETURN {row};
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER test_refused BEFORE {operation} ON {table}
               FOR EACH ROW EXECUTE FUNCTION test_refused();
            """
        )
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DROP TRIGGER test_refused ON {table}")
            cur.execute("DROP FUNCTION test_refused")


class PrivatePostgres:
    """A PostgreSQL server of the test's own (initdb in a temporary directory, a free port,
    trust auth), which the test may stop, restart and freeze. ``settings``: server settings
    (``max_connections`` for a cluster of many task groups, each on a session of its own);
    ``address``: where it listens besides 127.0.0.1 (a test network's service address, which
    it then trusts every client of); ``replica_of``: a running server this one is a streaming
    standby of (a base backup of it, not initdb)."""

    def __init__(
        self,
        settings: dict[str, object] | None = None,
        address: str = "127.0.0.1",
        replica_of: PrivatePostgres | None = None,
    ) -> None:
        self.settings = settings or {}
        self.address = address
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="keel-pg-"))
        self.data = self.dir / "data"
        self.url = f"postgres://postgres@{address}:{self.port}"
        if os.geteuid() == 0:
            shutil.chown(self.dir, user="postgres")
        assert find_pg_program("initdb"), "PostgreSQL's server programs are not installed"
        if replica_of is not None:
            backup = [find_pg_program("pg_basebackup"), "-h", "127.0.0.1", "-U", "postgres"]
            backup += ["-p", str(replica_of.port), "-D", str(self.data), "-R", "-X", "stream"]
            subprocess.run(as_postgres_user(backup), check=True, stdout=subprocess.DEVNULL)
            return
        initdb = [find_pg_program("initdb"), "-D", str(self.data), "-U", "postgres"]
        subprocess.run(
            as_postgres_user([*initdb, "--auth=trust", "-E", "UTF8", "--locale=C"]),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if address != "127.0.0.1":  # the test network's hosts (tests.netkit: a /16)
            network = ".".join(address.split(".")[:2]) + ".0.0/16"
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {network} trust\n")

    def _ctl(self, *args: str) -> None:
        listen = ",".join(dict.fromkeys(["127.0.0.1", self.address]))
        options = f"-p {self.port} -k {self.dir} -c listen_addresses={listen}" + "".join(
            f" -c {name}={value}" for name, value in self.settings.items()
        )
        ctl = [find_pg_program("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log")]
        subprocess.run(
            as_postgres_user([*ctl, "-o", options, "-w", *args]),
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def start(self) -> PrivatePostgres:
        self._ctl("start")
        return self

    def stop(self) -> None:
        """A fast shutdown: every session is ended, as in a restart."""
        self._ctl("-m", "fast", "stop")

    def crash(self) -> None:
        """An immediate shutdown: as a lost machine, no checkpoint, no goodbye to anyone."""
        self._ctl("-m", "immediate", "stop")

    def promote(self) -> None:
        """A standby becomes a primary (and answers writes once this returns)."""
        self._ctl("promote")

    def __enter__(self) -> PrivatePostgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


#: A streaming job checkpointing every 500 ms into Blackhole: what the outage tests watch.
CHECKPOINTING_STREAM = """
env { job.mode = STREAMING, parallelism = 2, checkpoint.interval = 500,
      job.retry.interval.seconds = 0 }
source { FakeSource { split.num = 2, rows.per-second = 200, endless = true } }
sink { Blackhole { } }
"""


def session_alive(conn) -> bool:
    """Whether a PostgreSQL session still answers (a fence or the server may have ended it)."""
    import psycopg

    try:
        conn.execute("SELECT 1")
        return True
    except (psycopg.OperationalError, psycopg.InterfaceError):
        return False
