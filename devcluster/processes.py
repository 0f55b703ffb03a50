"""The local cluster's files and processes, without Django: its shape (``cluster.json``), each
process's pid file and log, and starting a process afresh.

Kept free of Django so that ``./run cluster up`` and ``./run cluster start`` can start their
processes before their own interpreter sets Django up (devcluster.early): the two start-ups
overlap instead of adding up.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANAGE = str(ROOT / "manage.py")
#: engine.states.SlotMode's values (that module needs Django's models).
FIXED, DYNAMIC = "FIXED", "DYNAMIC"


class ClusterError(Exception):
    """A cluster command failed; the message is for the user, one line."""


@dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    kind: str  # web | master | worker
    #: A network namespace (``ip netns add``) it runs in: a test host of its own; "" for ours.
    netns: str = ""


@dataclass
class ClusterSpec:
    masters: int = 2
    workers: int = 2
    slots: int = 8
    slot_mode: str = FIXED
    heartbeat_timeout: float = 5.0
    port: int = 8000
    processes: list[ProcessSpec] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        *,
        masters: int,
        workers: int,
        slots: int,
        slot_mode: str,
        heartbeat_timeout: float,
        port: int,
        worker_tags: Sequence[tuple[str | None, dict[str, str]]] = (),
        hosts: Sequence[tuple[str, str]] = (),
    ) -> ClusterSpec:
        """The cluster's processes; ``worker_tags``: (a worker's name, or None for every
        worker; its tags), as ``--worker-tags`` gives them, each worker started with its own
        ``--tag`` arguments (so ``cluster start`` starts it again with the same tags)."""
        spec = cls(masters, workers, slots, str(slot_mode), heartbeat_timeout, port)
        py = sys.executable
        spec.processes.append(ProcessSpec("web", [py, MANAGE, "web", "--port", str(port)], "web"))
        for i in range(1, masters + 1):
            name = f"master-{i}"
            argv = [py, MANAGE, "master", "--name", name, "--heartbeat-timeout"]
            spec.processes.append(ProcessSpec(name, [*argv, str(heartbeat_timeout)], "master"))
        mode_flag = "--fixed-slots" if slot_mode == FIXED else "--dynamic-slots"
        names = [f"worker-{i}" for i in range(1, workers + 1)]
        tags: dict[str, dict[str, str]] = {name: {} for name in names}
        for target, pairs in worker_tags:
            if target is not None and target not in tags:
                raise ClusterError(
                    f"--worker-tags names {target!r}, not a worker of this cluster "
                    f"({names[0]}..{names[-1]})"
                )
            for name in names if target is None else [target]:
                tags[name].update(pairs)
        for name in names:
            argv = [py, MANAGE, "worker", "--name", name, "--slots", str(slots), mode_flag]
            argv += [arg for k, v in tags[name].items() for arg in ("--tag", f"{k}={v}")]
            spec.processes.append(ProcessSpec(name, argv, "worker"))
        for name, netns in hosts:
            proc = spec.process(name)
            if proc.kind == "web":
                raise ClusterError("--host: the web stays on this host (it serves the API here)")
            proc.netns = netns
        return spec

    def process(self, name: str) -> ProcessSpec:
        for proc in self.processes:
            if proc.name == name:
                return proc
        names = ", ".join(p.name for p in self.processes)
        raise ClusterError(f"no process named {name!r} in this cluster (names: {names})")


class ProcessFiles:
    """A cluster directory: the spec, and a pid file and a log per process."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    @property
    def spec_path(self) -> Path:
        return self.dir / "cluster.json"

    def pid_path(self, name: str) -> Path:
        return self.dir / f"{name}.pid"

    def log_path(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def load_spec(self) -> ClusterSpec:
        try:
            data = json.loads(self.spec_path.read_text())
        except FileNotFoundError:
            raise ClusterError("no cluster here: start one with `./run cluster up`") from None
        procs = [ProcessSpec(**p) for p in data.pop("processes")]
        return ClusterSpec(**data, processes=procs)

    def save_spec(self, spec: ClusterSpec) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.spec_path.write_text(json.dumps(asdict(spec), indent=2))

    def pid(self, name: str) -> int | None:
        """The pid of a running process of ours, or None (a recycled pid is not ours)."""
        try:
            pid_text, *start = self.pid_path(name).read_text().split()
            pid = int(pid_text)
        except (FileNotFoundError, ValueError):
            return None
        if start and process_start_time(pid) not in (None, start[0]):
            return None  # that pid now belongs to another process
        return pid

    @staticmethod
    def pid_alive(pid: int | None) -> bool:
        if not pid:
            return False
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # reap our own child if it died
        stat = _proc_stat(pid)
        return stat is not None and stat[0] not in ("Z", "X")

    def alive(self, name: str) -> bool:
        return self.pid_alive(self.pid(name))

    def status(self) -> list[dict]:
        spec = self.load_spec()
        return [
            {"name": p.name, "kind": p.kind, "pid": self.pid(p.name), "alive": self.alive(p.name)}
            for p in spec.processes
        ]

    def record_pid(self, name: str, pid: int) -> None:
        self.pid_path(name).write_text(f"{pid} {process_start_time(pid) or ''}")

    def start_fresh(self, proc: ProcessSpec, env: dict[str, str]) -> int:
        """Start ``proc`` in a new session, its output appended to its log; record its pid."""
        self.dir.mkdir(parents=True, exist_ok=True)
        check_netns(proc.netns)
        with open(self.log_path(proc.name), "ab") as log:
            child = subprocess.Popen(
                proc.argv,
                preexec_fn=(lambda: enter_netns(proc.netns)) if proc.netns else None,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=ROOT,
                start_new_session=True,
            )
        self.record_pid(proc.name, child.pid)
        return child.pid


#: setns(2)'s flag for a network namespace.
CLONE_NEWNET = 0x40000000
_SETNS = ctypes.CDLL(None, use_errno=True).setns  # looked up now, not in a forked child
_SETNS.argtypes = [ctypes.c_int, ctypes.c_int]


def netns_path(name: str) -> Path:
    return Path("/run/netns") / name


def check_netns(name: str) -> None:
    """A process about to start in network namespace ``name`` needs it to exist: a clear
    error here, not a child that dies before it can say why."""
    if name and not netns_path(name).exists():
        raise ClusterError(f"no network namespace {name!r} (make it with `ip netns add {name}`)")
    if name and os.geteuid() != 0:
        raise ClusterError(f"--host {name}: entering a network namespace needs root")


def enter_netns(name: str) -> None:
    """Move this process (single-threaded: just forked) into network namespace ``name``, as
    ``ip netns exec`` does for its command: every socket it opens from now on is that host's.
    Python 3.11 has no os.setns, so libc's, looked up before any fork (a lookup in the
    child of a threaded parent could wait forever on a lock another thread held)."""
    fd = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _SETNS(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {name!r}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def process_env(proc: ProcessSpec) -> dict[str, str]:
    """A cluster process's environment: ours, with its name (and not what a ``cluster``
    command started early: devcluster.early)."""
    env = dict(os.environ, KEEL_PROCESS_NAME=proc.name, PYTHONUNBUFFERED="1")
    env.pop("KEEL_CLUSTER_STARTED_EARLY", None)
    return env


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()


def process_start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None
