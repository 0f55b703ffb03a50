"""The managed Source runtime's options: the design's initial production defaults, each read
from its environment variable, a bad value refused at startup with the variable's name."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings

DESIGN_DEFAULTS = {
    "mailbox.max-commands": 1024,
    "mailbox.max-bytes": 4 * 1024**2,
    "mailbox.reserved-commands": 64,
    "mailbox.reserved-bytes": 256 * 1024,
    "worker-mailbox.max-bytes": 256 * 1024**2,
    "command.max-payload-bytes": 512 * 1024,
    "poll.max-records": 64,
    "poll.soft-duration": 0.005,
    "poll.hard-duration": 1.0,
    "poll.cancellation-timeout": 30.0,
    "admission.p99-budget": 0.005,
    "retry.initial-backoff": 0.010,
    "retry.max-backoff": 1.0,
    "coordinator.async-max-concurrency": 4,
    "tracker.max-entries": 100_000,
    "tracker.max-bytes": 64 * 1024**2,
    "discovery.max-pending": 10_000,  # Keel's: new files waiting for a reader
    "assignment.max-reader-splits": 1000,  # Keel's: held by a reader that reports its backlog
}


def test_the_defaults_are_the_design_s():
    engine = settings.ENGINE
    assert {k: engine[f"source-runtime.{k}"] for k in DESIGN_DEFAULTS} == DESIGN_DEFAULTS
    assert engine["source-runtime.managed-enabled"] is True
    assert engine["source-runtime.managed-connectors"] == []


def read(env: dict) -> subprocess.CompletedProcess:
    code = (
        "import django, json; django.setup(); from django.conf import settings; "
        "print(json.dumps({k: v for k, v in settings.ENGINE.items() "
        "if k.startswith('source-runtime')}))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "keel.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_each_comes_from_its_environment_variable_and_a_bad_one_is_named():
    import json

    proc = read(
        {
            "KEEL_SOURCE_RUNTIME_POLL_MAX_RECORDS": "128",
            "KEEL_SOURCE_RUNTIME_MAILBOX_MAX_BYTES": "8MiB",
            "KEEL_SOURCE_RUNTIME_POLL_SOFT_DURATION": "20ms",
            "KEEL_SOURCE_RUNTIME_MANAGED_ENABLED": "false",
            "KEEL_SOURCE_RUNTIME_MANAGED_CONNECTORS": "FakeSource, LocalFile",
        }
    )
    options = json.loads(proc.stdout)
    assert options["source-runtime.poll.max-records"] == 128
    assert options["source-runtime.mailbox.max-bytes"] == 8 * 1024**2
    assert options["source-runtime.poll.soft-duration"] == 0.02
    assert options["source-runtime.managed-enabled"] is False
    assert options["source-runtime.managed-connectors"] == ["FakeSource", "LocalFile"]
    bad = read({"KEEL_SOURCE_RUNTIME_TRACKER_MAX_BYTES": "lots"})
    assert bad.returncode != 0 and "KEEL_SOURCE_RUNTIME_TRACKER_MAX_BYTES" in bad.stderr
