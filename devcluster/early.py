"""``./run cluster up`` and ``./run cluster start``: their processes start before Django does.

A fresh ``manage.py cluster`` spends most of a second setting Django up (more for ``up``, which
makes the API's tokens) before it starts anything, and each process it starts then spends as
long again. Started first, the processes' start-ups overlap the command's own: ``manage.py``
calls ``start_early`` before Django is set up, and the command then only waits for what was
started here (it finds their pids in ``STARTED``), reports, and makes the tokens. Anything
this cannot judge without Django (a bad argument, a cluster already running, a name that is
not in the cluster) it leaves alone: the command then starts nothing early and says what is
wrong as it always did.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import time
from pathlib import Path

from devcluster.processes import ROOT, ClusterError, ClusterSpec, ProcessFiles, process_env

#: Names and pids of the processes this interpreter started early (JSON), for the command.
STARTED = "KEEL_CLUSTER_STARTED_EARLY"


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    """``cluster up``'s options (the command and the early start parse the same)."""
    from engine.cli import add_slot_options, worker_tags

    parser.add_argument("--masters", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    add_slot_options(parser)
    parser.add_argument("--heartbeat-timeout", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--worker-tags",
        type=worker_tags,
        action="append",
        default=[],
        metavar="[WORKER:]KEY=VALUE[,KEY=VALUE]",
        help="tags of a worker (e.g. worker-1:group=platform,team=team1), or of every worker "
        "without WORKER:; matched by a job's env.tag_filter (repeatable)",
    )
    parser.add_argument(
        "--host",
        type=host_option,
        action="append",
        default=[],
        metavar="PROCESS=NETNS",
        help="run a master or worker in a network namespace made with `ip netns add` (a test "
        "host of its own, e.g. worker-1=keel-h1); repeatable",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=90.0,
        help="seconds to wait for the cluster to become healthy",
    )


def host_option(text: str) -> tuple[str, str]:
    """``--host PROCESS=NETNS``: (the process's name, the namespace's)."""
    name, sep, netns = text.partition("=")
    if not sep or not name or not netns or "/" in netns:
        raise argparse.ArgumentTypeError(f"expected PROCESS=NETNS, got {text!r}")
    return name, netns


def started_early() -> dict[str, int]:
    """The processes this interpreter started before Django was set up: {name: pid}."""
    try:
        return {str(k): int(v) for k, v in json.loads(os.environ.get(STARTED, "{}")).items()}
    except (ValueError, AttributeError):
        return {}


def start_early(argv: list[str]) -> None:
    """Start the processes of ``manage.py cluster up|start ...`` now, if it is one."""
    if argv[1:2] != ["cluster"] or len(argv) < 3 or any(a in ("-h", "--help") for a in argv):
        return
    files = _files()
    try:
        if argv[2] == "up":
            procs = _up(files, argv[3:])
        elif argv[2] == "start":
            procs = _start(files, argv[3:])
        else:
            return
    except (ClusterError, OSError, ValueError):
        return
    started: dict[str, int] = {}
    try:
        for proc in procs:
            started[proc.name] = files.start_fresh(proc, process_env(proc))
    except ClusterError:  # (a missing network namespace): the command says so
        _stop(files, started)
        return
    except BaseException:
        _stop(files, started)
        raise
    os.environ[STARTED] = json.dumps(started)


#: The names the command took over (``adopt``): from then on they are its to stop.
_adopted: set[str] = set()


def adopt(name: str) -> None:
    _adopted.add(name)


def abandon() -> None:
    """The command ended before taking over what started early (Ctrl-C during set-up, a
    setting it refused): stop those processes, which nobody would otherwise wait for."""
    left = {name: pid for name, pid in started_early().items() if name not in _adopted}
    if left:
        _stop(_files(), left)


def _files() -> ProcessFiles:
    return ProcessFiles(Path(os.environ.get("KEEL_VAR_DIR", ROOT / ".var")) / "cluster")


def _stop(files: ProcessFiles, started: dict[str, int]) -> None:
    """SIGKILL what we started and wait (briefly) until it is gone: nothing of a command that
    failed outlives it."""
    killed = []
    for name, pid in started.items():
        if files.pid(name) == pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            files.pid_path(name).unlink(missing_ok=True)
    deadline = time.monotonic() + 5
    while any(files.pid_alive(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.01)


def _start(files: ProcessFiles, args: list[str]) -> list:
    if not args or any(a.startswith("-") for a in args):
        return []
    spec = files.load_spec()
    procs = [spec.process(name) for name in dict.fromkeys(args)]
    return [proc for proc in procs if not files.alive(proc.name)]


def _up(files: ProcessFiles, args: list[str]) -> list:
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_up_arguments(parser)
    try:
        opts, unknown = parser.parse_known_args(args)
    except (argparse.ArgumentError, SystemExit):
        return []
    if unknown or min(opts.masters, opts.workers) < 1 or opts.slots < 0:
        return []
    if opts.heartbeat_timeout <= 0:
        return []
    if files.spec_path.exists() and any(p["alive"] for p in files.status()):
        return []  # the command says a cluster is already running here
    try:
        spec = ClusterSpec.build(
            masters=opts.masters,
            workers=opts.workers,
            slots=opts.slots,
            slot_mode=opts.slot_mode,
            heartbeat_timeout=opts.heartbeat_timeout,
            port=opts.port,
            worker_tags=opts.worker_tags,
            hosts=opts.host,
        )
    except ClusterError:
        return []  # the command says what is wrong
    files.save_spec(spec)
    for proc in spec.processes:
        files.pid_path(proc.name).unlink(missing_ok=True)
    return spec.processes
