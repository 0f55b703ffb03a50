"""A local cluster's processes start at once against a new var directory: they all end up
with the same secret key, none with an empty one, and none fails to start."""

from __future__ import annotations

import multiprocessing
import os

import keel.settings


def _key(var_dir: str, barrier, answers) -> None:
    keel.settings.VAR_DIR = type(keel.settings.VAR_DIR)(var_dir)
    os.environ.pop("DJANGO_SECRET_KEY", None)
    barrier.wait(10)
    try:
        answers.put(keel.settings._secret_key())
    except Exception as exc:
        answers.put(f"failed: {exc!r}")


def test_processes_starting_together_share_one_secret_key(tmp_path):
    forked = multiprocessing.get_context("fork")
    count = 12
    barrier, answers = forked.Barrier(count), forked.Queue()
    procs = [
        forked.Process(target=_key, args=(str(tmp_path / "var"), barrier, answers))
        for _ in range(count)
    ]
    for proc in procs:
        proc.start()
    keys = [answers.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join(10)
    assert len(set(keys)) == 1 and len(keys[0]) > 40, keys
    assert (tmp_path / "var" / "secret-key").read_text().strip() == keys[0]
    assert sorted(p.name for p in (tmp_path / "var").iterdir()) == ["secret-key"]
