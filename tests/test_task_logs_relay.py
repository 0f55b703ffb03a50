"""The web process's relay hears a worker's task log notification (engine.member.tasklog_shipping
notifies LOGS_CHANNEL with the jobs written) and tells those jobs' pages to redraw."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from channels.layers import get_channel_layer
from django.conf import settings

from dashboard import relay
from engine.jobs.tasklog_reading import LOGS_CHANNEL, jobs_notified
from tests.test_ws import run

pytestmark = pytest.mark.django_db(transaction=True)


def notify(payload: str) -> None:
    db = settings.DATABASES["default"]
    with psycopg.connect(
        host=db.get("HOST") or None,
        port=db.get("PORT") or None,
        dbname=db["NAME"],
        user=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        autocommit=True,
        connect_timeout=5,
    ) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", [LOGS_CHANNEL, payload])


def test_the_pages_of_the_jobs_named_are_told_to_redraw():
    relay.ensure_started()

    async def scenario():
        layer = get_channel_layer()
        named, other = await layer.new_channel(), await layer.new_channel()
        await layer.group_add("job.4242", named)
        await layer.group_add("job.7", other)
        deadline = asyncio.get_running_loop().time() + 20
        while True:  # the relay LISTENs once its thread has connected: notify until heard
            await asyncio.to_thread(notify, "4242,99")
            try:
                message = await asyncio.wait_for(layer.receive(named), 0.5)
                break
            except TimeoutError:
                assert asyncio.get_running_loop().time() < deadline, "the relay never forwarded"
        assert message == {"type": "relay.samples"}
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(layer.receive(other), 0.3)

    run(scenario())


def test_payloads_are_comma_lists_of_job_ids():
    assert jobs_notified(["1,2", "2, 30", "", "x"]) == {1, 2, 30}
