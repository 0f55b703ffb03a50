"""``cluster up --host PROCESS=NETNS`` runs a master or worker in a network namespace of its
own (a test host): the option is checked before anything starts, a missing namespace is a
clear error, and a process started in one really has that namespace's network."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from devcluster.early import host_option
from devcluster.processes import (
    ClusterError,
    ClusterSpec,
    ProcessFiles,
    ProcessSpec,
    check_netns,
    netns_path,
)
from tests.clusterkit import wait_for


def build(hosts):
    return ClusterSpec.build(
        masters=2,
        workers=2,
        slots=4,
        slot_mode="FIXED",
        heartbeat_timeout=5.0,
        port=8000,
        hosts=hosts,
    )


def test_a_named_process_gets_its_namespace_and_the_others_stay_here():
    spec = build([("worker-1", "ns1"), ("master-2", "ns2")])
    netns = {p.name: p.netns for p in spec.processes}
    assert netns == {
        "web": "",
        "master-1": "",
        "master-2": "ns2",
        "worker-1": "ns1",
        "worker-2": "",
    }


def test_the_namespace_survives_the_spec_file(tmp_path):
    """``cluster start`` reads the spec back: a restarted process returns to its host."""
    files = ProcessFiles(tmp_path / "cluster")
    files.save_spec(build([("worker-2", "ns9")]))
    assert files.load_spec().process("worker-2").netns == "ns9"


def test_the_web_cannot_be_moved():
    with pytest.raises(ClusterError, match="web"):
        build([("web", "ns1")])


def test_an_unknown_process_is_refused():
    with pytest.raises(ClusterError, match="worker-9"):
        build([("worker-9", "ns1")])


def test_a_missing_namespace_names_the_command_that_makes_it():
    check_netns("")  # no namespace: this host's, nothing to check
    with pytest.raises(ClusterError, match="ip netns add no-such-ns-xyz"):
        check_netns("no-such-ns-xyz")


def test_a_process_in_a_missing_namespace_is_not_started(tmp_path):
    """The error comes before the fork, so no pid is recorded for a child that would die."""
    files = ProcessFiles(tmp_path / "cluster")
    proc = ProcessSpec("worker-1", [sys.executable, "-c", "pass"], "worker", "no-such-ns-xyz")
    with pytest.raises(ClusterError, match="ip netns add"):
        files.start_fresh(proc, dict(os.environ))
    assert files.pid("worker-1") is None


def test_host_option_parses_process_equals_namespace():
    assert host_option("worker-1=kp0h1") == ("worker-1", "kp0h1")
    for bad in ("x", "=y", "a=", "a=b/c"):
        with pytest.raises(argparse.ArgumentTypeError):
            host_option(bad)


@pytest.fixture
def netns():
    """A network namespace of this test, removed after it; skipped where none can be made."""
    if os.geteuid() != 0:
        pytest.skip("making a network namespace needs root")
    name = f"kt{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"`ip netns add` failed here: {made.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


def test_a_process_started_in_a_namespace_runs_inside_it(tmp_path, netns):
    files = ProcessFiles(tmp_path / "cluster")
    argv = [sys.executable, "-c", "import os; print(os.readlink('/proc/self/ns/net'), flush=True)"]
    pid = files.start_fresh(ProcessSpec("worker-1", argv, "worker", netns), dict(os.environ))
    log = files.log_path("worker-1")
    link = wait_for(
        lambda: log.read_text().strip(), 10, interval=0.02, what="the child's namespace line"
    )
    os.waitpid(pid, 0)
    ours = os.readlink("/proc/self/ns/net")
    assert link.startswith("net:[") and link != ours
    assert link == f"net:[{os.stat(netns_path(netns)).st_ino}]"
