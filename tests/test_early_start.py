"""``manage.py cluster up|start`` start their processes before Django is set up
(devcluster.early): only what the command would start, and nothing is left behind when the
command ends before it takes them over."""

from __future__ import annotations

import json
import sys

import pytest

from devcluster import early
from devcluster.processes import ClusterSpec, ProcessFiles, ProcessSpec
from tests.clusterkit import pid_alive, wait_for

IDLE = [sys.executable, "-c", "import signal; signal.pause()"]  # lives until it is killed


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setenv("KEEL_VAR_DIR", str(tmp_path))
    monkeypatch.delenv(early.STARTED, raising=False)
    monkeypatch.setattr(early, "_adopted", set())
    files = ProcessFiles(tmp_path / "cluster")
    spec = ClusterSpec(processes=[ProcessSpec("worker-1", IDLE, "worker")])
    files.save_spec(spec)
    return files


def test_start_starts_the_named_process_and_abandon_stops_it(files):
    early.start_early(["manage.py", "cluster", "start", "worker-1"])
    started = early.started_early()
    assert list(started) == ["worker-1"] and files.pid("worker-1") == started["worker-1"]
    assert pid_alive(started["worker-1"])
    early.abandon()
    wait_for(lambda: not pid_alive(started["worker-1"]), 10, what="the process to be stopped")
    assert not files.pid_path("worker-1").exists()


def test_an_adopted_process_is_the_commands(files):
    early.start_early(["manage.py", "cluster", "start", "worker-1"])
    pid = early.started_early()["worker-1"]
    try:
        early.adopt("worker-1")
        early.abandon()
        assert pid_alive(pid)
    finally:
        early._stop(files, {"worker-1": pid})


@pytest.mark.parametrize(
    "args",
    [
        ["start", "worker-1", "worker-9"],  # a name the cluster does not have
        ["start", "--help"],
        ["up", "--masters", "0"],
        ["up", "--no-such-flag"],
        ["up", "--slots", "many"],
        ["status"],
    ],
)
def test_what_the_command_would_refuse_starts_nothing(files, args):
    before = files.spec_path.read_text()
    early.start_early(["manage.py", "cluster", *args])
    assert early.started_early() == {} and not files.alive("worker-1")
    assert files.spec_path.read_text() == before


def test_up_does_not_start_over_a_running_cluster(files):
    early.start_early(["manage.py", "cluster", "start", "worker-1"])
    pid = early.started_early()["worker-1"]
    try:
        early.start_early(["manage.py", "cluster", "up"])
        assert json.loads(files.spec_path.read_text())["workers"] == 2  # the fixture's spec
        assert [p["name"] for p in json.loads(files.spec_path.read_text())["processes"]] == [
            "worker-1"
        ]
    finally:
        early._stop(files, {"worker-1": pid})
