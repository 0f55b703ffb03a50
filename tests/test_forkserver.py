"""Masters and workers forked by the test kit's fork server (devcluster.forkserver) are the
processes a fresh start gives: their own session, their own name in the kernel and in
PostgreSQL, and the signal dispositions of a fresh interpreter (a write to a closed socket
raises, it does not kill)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.clusterkit import PYTHON, ROOT, Cluster, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def forked(db_template):
    with Cluster(db_template, masters=2, workers=1, slots=2) as c:
        yield c


def signal_masks(pid: int) -> dict[str, str]:
    """The ignored and blocked signals of a process, from /proc."""
    fields = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {k: fields[k].strip() for k in ("SigIgn", "SigBlk")}


def _foreground_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)


def test_a_forked_process_is_a_fresh_one_in_every_way_that_shows(forked, tmp_path):
    pids = {name: forked.pid(name) for name in ("master-1", "master-2", "worker-1")}
    server = _ppid(pids["master-1"])
    assert b"devcluster.forkserver" in _cmdline(server)
    assert b"devcluster.control" in _cmdline(_ppid(server))
    for name, pid in pids.items():
        assert _ppid(pid) == server, name  # forked by the server, not exec'd
        assert _cmdline(pid) == _cmdline(server)
        assert Path(f"/proc/{pid}/comm").read_text().strip() == name[:15]
        assert _sid(pid) == pid, f"{name} is not the leader of its own session"
    # The server was started with the first child's environment (master-1's name): the
    # second master's sessions must carry its own name and pid, not those.
    for name in ("master-1", "master-2"):
        wait_for(
            lambda n=name: forked.one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                (f"keel:{n}:{pids[n]}",),
            ),
            10,
            interval=0.1,
            what=f"a session of {name} under its own name and pid",
        )

    # A fresh worker of the same cluster, for its signal dispositions, started as a shell
    # starts a command in the foreground: with SIGINT and SIGQUIT at their defaults, whatever
    # this test process inherited (a background job of a script ignores both).
    with open(tmp_path / "fresh.log", "w") as log:
        fresh = subprocess.Popen(
            [PYTHON, "manage.py", "worker", "--name", "fresh-worker", "--slots", "1"],
            cwd=ROOT,
            env=forked.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_foreground_signals,
        )
    try:
        wait_for(
            lambda: forked.one(
                "SELECT count(*) FROM engine_member WHERE name = 'fresh-worker' AND state = 'ALIVE'"
            ),
            60,
            interval=0.1,
            what="the fresh worker ALIVE",
        )
        assert signal_masks(pids["worker-1"]) == signal_masks(fresh.pid)
    finally:
        fresh.send_signal(signal.SIGTERM)
        fresh.wait(30)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _ppid(pid: int) -> int:
    return int(_stat(pid)[1])


def _sid(pid: int) -> int:
    return int(_stat(pid)[3])
