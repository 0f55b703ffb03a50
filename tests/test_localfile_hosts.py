"""Checkpointed LocalFile sinks keep pending parts under their path until a checkpoint commits
them: on workers of several hosts the path must be shared storage, or the job is refused with
an error naming the sink's path."""

from __future__ import annotations

import pytest
from django.conf import settings

from engine.jobconfig import ConfigError
from engine.jobs.submission import submit_job
from engine.models import Member

pytestmark = pytest.mark.django_db(transaction=True)


def config(tmp_path, interval: int) -> str:
    return (
        f"env {{ job.mode = STREAMING, checkpoint.interval = {interval} }}\n"
        "source { FakeSource { } }\n"
        f'sink {{ LocalFile {{ path = "{tmp_path}", file_format_type = csv }} }}'
    )


def test_refused_on_two_hosts_unless_the_storage_is_shared(engine, tmp_path, monkeypatch):
    engine.add_member()
    submit_job(config(tmp_path, 1000))  # one host: its pending parts stay reachable
    other = engine.add_member()
    Member.objects.filter(id=other.id).update(host="worker-host-2")  # as it registers there

    with pytest.raises(ConfigError) as refused:
        submit_job(config(tmp_path, 1000))
    [error] = refused.value.errors
    assert error["path"] == "sink[0].LocalFile.path"
    assert "2 hosts" in error["message"] and "engine.localfile.shared-storage" in error["message"]

    submit_job(config(tmp_path, 0))  # no checkpoints: nothing pending to lose
    monkeypatch.setitem(settings.ENGINE, "localfile.shared-storage", True)
    submit_job(config(tmp_path, 1000))
