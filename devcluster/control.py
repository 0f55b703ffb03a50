"""One long-lived process that runs a local cluster's commands, for tests and benchmarks.

``./run cluster start worker-1`` costs a fresh interpreter and Django's set-up before it does
anything; a test kit that restarts processes all day pays that on every call. This process pays
once per cluster: it runs the same ``manage.py`` commands in-process, one per request, and
forks masters and workers from a fork server (devcluster.forkserver). Tests of the command line
itself still run ``./run``.

Protocol, on stdin and stdout: one JSON object per line, ``{"argv"}`` in (the command's
arguments after ``manage.py``), ``{"rc", "stdout", "stderr"}`` out. Run as ``python -m
devcluster.control`` in the cluster's environment; a cluster whose environment changes needs a
new one (settings are read once).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

from devcluster.forkserver import run_command

ROOT = Path(__file__).resolve().parent.parent


def run(argv: list[str]) -> tuple[int, str, str]:
    """Run ``manage.py argv`` here: its exit status and what it printed."""
    from django.db import connections

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_command(argv)
        finally:
            # No session outlives a command: the cluster's database may be dropped, or its
            # server restarted, between two requests.
            connections.close_all()
    return code, out.getvalue(), err.getvalue()


def serve() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")
    import django

    django.setup()
    from django.conf import settings

    from devcluster import localcluster

    localcluster.fork_server = localcluster.ForkServer(
        Path(settings.VAR_DIR) / "cluster" / "forkserver.log"
    )
    reply = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write on the answers' channel
    print(json.dumps({"ready": os.getpid()}), file=reply, flush=True)
    try:
        for line in sys.stdin:
            code, out, err = run(list(json.loads(line)["argv"]))
            print(json.dumps({"rc": code, "stdout": out, "stderr": err}), file=reply, flush=True)
    finally:
        localcluster.fork_server.close()


if __name__ == "__main__":
    serve()
