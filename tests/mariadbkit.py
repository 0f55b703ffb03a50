"""A MariaDB server of the tests' own (never the machine's shared one): a data directory made
once per test process, ``mariadbd`` on a free port and its own socket, a user ``keel`` (password
``keel``) with every privilege. One server serves every test of a process (``shared()``, the
``mariadb`` fixture); a test that stops or freezes one starts its own (``PrivateMariaDB()``)."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pymysql
import pytest

from tests.clusterkit import free_port, wait_for
from tests.faultkit import Freezable

USER, PASSWORD = "keel", "keel"
#: Server settings for tests: durability is traded for speed (a test never survives a crash of
#: the server it made), LOAD DATA LOCAL INFILE allowed, room for a cluster's sessions.
SERVER_FLAGS = (
    "--skip-name-resolve",
    "--skip-log-bin",
    "--local-infile=1",
    "--max-connections=300",
    "--innodb-buffer-pool-size=256M",
    "--innodb-log-file-size=64M",
    "--innodb-flush-log-at-trx-commit=2",
    "--innodb-doublewrite=0",
    "--sync-binlog=0",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_general_ci",
    "--default-time-zone=+00:00",
)


def _program(name: str, *fallbacks: str) -> str:
    for candidate in (name, *fallbacks):
        found = shutil.which(candidate) or next(
            (str(p) for p in (Path("/usr/sbin") / candidate,) if p.exists()), None
        )
        if found:
            return found
    raise AssertionError(f"{name} is not installed (apt-get install mariadb-server)")


class PrivateMariaDB(Freezable):
    """``mariadb-install-db`` into a temporary directory, then ``mariadbd`` bound to 127.0.0.1
    on a free port. ``url`` is the JDBC URL of its database ``keel``."""

    def __init__(self, settings: dict[str, object] | None = None) -> None:
        self.settings = settings or {}
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="keel-mariadb-"))
        self.data = self.dir / "data"
        self.socket = str(self.dir / "mysqld.sock")
        self.proc: subprocess.Popen | None = None
        self.user = ["--user=root"] if os.geteuid() == 0 else []
        subprocess.run(
            [
                _program("mariadb-install-db", "mysql_install_db"),
                "--no-defaults",
                f"--datadir={self.data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                *self.user,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"jdbc:mysql://127.0.0.1:{self.port}/keel"

    def start(self) -> PrivateMariaDB:
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in self.settings.items()]
        self.proc = subprocess.Popen(
            [
                _program("mariadbd", "mysqld"),
                "--no-defaults",
                f"--datadir={self.data}",
                f"--socket={self.socket}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--pid-file={self.dir / 'mariadbd.pid'}",
                f"--log-error={self.dir / 'error.log'}",
                f"--tmpdir={self.dir}",
                *SERVER_FLAGS,
                *self.user,
                *flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._ready, 30, interval=0.05, what=f"a private MariaDB on port {self.port}")
        with self.root() as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE IF NOT EXISTS keel")
            cur.execute(f"CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'")
            cur.execute(f"GRANT ALL ON *.* TO '{USER}'@'%'")
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.dir / "error.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"mariadbd exited ({self.proc.returncode}):\n{log}")
        try:
            self.root().close()
            return True
        except pymysql.err.OperationalError:
            return False

    def root(self, database: str | None = None) -> pymysql.Connection:
        """An administrative session over the server's socket (autocommit)."""
        return pymysql.connect(
            unix_socket=self.socket,
            user="root",
            database=database,
            autocommit=True,
            connect_timeout=2,
            local_infile=True,
        )

    def connect(self, database: str = "keel") -> pymysql.Connection:
        """A session as the test user over TCP, as a job's would be (autocommit)."""
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user=USER,
            password=PASSWORD,
            database=database,
            autocommit=True,
            connect_timeout=5,
            local_infile=True,
        )

    def config(self, **options) -> dict:
        """A Jdbc block's options for this server's database ``keel``."""
        return {"url": self.url, "user": USER, "password": PASSWORD, **options}

    def execute(self, *statements: str) -> list[tuple]:
        """Run statements in the database ``keel``; the last one's rows."""
        rows: list[tuple] = []
        with self.connect() as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
                rows = list(cur.fetchall())
        return rows

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> PrivateMariaDB:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.thaw() if self.proc is not None else None
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


_SHARED: PrivateMariaDB | None = None


def shared() -> PrivateMariaDB:
    """The process's one MariaDB, started at first use and stopped when the process exits."""
    global _SHARED
    if _SHARED is None:
        _SHARED = PrivateMariaDB().start()
        atexit.register(_SHARED.close)
    return _SHARED


@pytest.fixture(scope="session")
def mariadb() -> PrivateMariaDB:
    """The shared private MariaDB (import this fixture into a test module to use it)."""
    return shared()
