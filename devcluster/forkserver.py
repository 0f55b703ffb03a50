"""A fork server for local clusters: masters and workers forked from one set-up interpreter.

Each engine process started fresh pays for an interpreter, Django's set-up and the engine's
imports (about a second of CPU). The fork server pays once: it sets Django up with the engine's
apps (engine.process), imports what masters and workers run, opens no connection, and forks each
process from there. A child gets its own session (setsid), its log on stdout and stderr, its
own process name in the settings and in PostgreSQL's ``application_name``, and Celery's
after-fork hooks; then it runs ``manage.py`` as a fresh process would.

It serves only a child whose environment is its own (settings are read once, at its start);
``devcluster.localcluster`` starts any other the usual way. Protocol, on stdin and stdout: one
JSON object per line, ``{"name", "argv", "log", "netns"}`` in, ``{"pid"}`` or ``{"error"}`` out.

Run as ``python -m devcluster.forkserver`` in the cluster's environment.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import multiprocessing.util
import os
import select
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import IO

from devcluster.processes import enter_netns

#: What a master or a worker imports on its way to running: imported once, here.
PRELOAD = (
    "engine.management.commands.master",
    "engine.management.commands.worker",
    "engine.member.worker",
    "engine.master.loop",
    "celery.worker",
    "celery.apps.worker",
    "kombu.transport.redis",
)
#: Variables a child gets of its own; any other difference in the environment is a different
#: configuration, which a fork cannot give.
PER_PROCESS_ENV = frozenset({"KEEL_PROCESS_NAME", "PYTHONUNBUFFERED"})
ROOT = Path(__file__).resolve().parent.parent


def comparable_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_PROCESS_ENV}


def read_answer(stream: IO[bytes], timeout: float) -> dict | None:
    """The next one-line JSON answer on ``stream`` (a server's stdout), or None if none came
    within ``timeout`` seconds or the server is gone."""
    ready, _, _ = select.select([stream], [], [], timeout)
    line = stream.readline() if ready else b""
    return json.loads(line) if line else None


def run_command(argv: list[str]) -> int:
    """Run ``manage.py argv`` in this interpreter; its exit status as a fresh process would
    give it (``sys.exit``'s code, 1 with the traceback for any other exception)."""
    import manage

    try:
        manage.main(["manage.py", *argv])
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def set_up() -> None:
    """Django with the engine's apps, the engine imported, no connection open."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")
    from engine import process

    process.role = process.ENGINE
    import django

    django.setup()
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    from django.db import connections

    connections.close_all()


def _set_comm(name: str) -> None:
    """The kernel's name of this process (``ps -o comm``, ``top``): the member's, not ours."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def become(name: str, argv: list[str], log: str, netns: str = "") -> int:
    """In the forked child: detach, take the process's identity (and its host's network
    namespace, if it has one), and run its command; the exit status."""
    os.setsid()
    # The server's only change to an interpreter's signal dispositions (SIGPIPE and SIGXFSZ
    # stay ignored, as Python sets them: a write to a closed socket raises, never kills).
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    sys.stdout.reconfigure(line_buffering=True, write_through=True)
    sys.stderr.reconfigure(line_buffering=True, write_through=True)
    if netns:
        try:
            enter_netns(netns)  # before any socket: the fork server opened none
        except OSError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
    os.environ["KEEL_PROCESS_NAME"] = name
    os.environ["PYTHONUNBUFFERED"] = "1"
    _set_comm(name)

    from django.conf import settings

    from engine.dbsession import django_application_name

    settings.PROCESS_NAME = name
    application_name = django_application_name(name, os.getpid())
    # The connections' settings are this same dict (no connection is open yet).
    settings.DATABASES["default"]["OPTIONS"]["application_name"] = application_name
    multiprocessing.util._run_after_forkers()  # Celery's and kombu's after-fork hooks
    sys.argv = [str(ROOT / "manage.py"), *argv]
    return run_command(argv)


def fork(name: str, argv: list[str], log: str, netns: str = "") -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = become(name, argv, log, netns)
    finally:
        try:
            # As an interpreter ends: wait for its non-daemon threads, then its exit handlers
            # (logging's flush among them); never back into the server's loop.
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    # Children are reaped by the kernel: the cluster watches them by pid and start time.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    reply = sys.stdout
    print(json.dumps({"ready": os.getpid()}), file=reply, flush=True)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            args = (request["name"], list(request["argv"]), request["log"])
            answer = {"pid": fork(*args, request.get("netns", ""))}
        except Exception as exc:  # a bad request is answered, never the server's end
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), file=reply, flush=True)


if __name__ == "__main__":
    set_up()
    serve()
