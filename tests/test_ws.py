"""``/ws/events/``: engine events pushed in order to authenticated clients, resumable by seq."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import transaction

from dashboard.routing import websocket_urlpatterns
from engine.events import append_event
from engine.models import EngineEvent
from tests.conftest import role_user

pytestmark = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def append(kind: str) -> int:
    with transaction.atomic():
        return append_event(EngineEvent(kind=kind)).seq


async def connect(path: str, user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    return communicator


async def collect(communicator, count: int) -> list[dict]:
    events = []
    while len(events) < count:
        frame = await communicator.receive_json_from(timeout=10)
        assert frame["type"] == "engine.events"
        events += frame["events"]
    return events


def test_stream_pushes_new_events_and_resumes_after_a_seq():
    user = role_user("ws", "viewer")

    async def scenario():
        first = await append("test.a")
        communicator = await connect("/ws/events/?after=0", user)
        connected, _ = await communicator.connect()
        assert connected
        assert [e["kind"] for e in await collect(communicator, 1)] == ["test.a"]
        second = await append("test.b")
        third = await append("test.c")
        events = await collect(communicator, 2)
        assert [e["seq"] for e in events] == [second, third]
        await communicator.disconnect()
        # A client that reconnects with the last seq it saw gets only what followed.
        again = await connect(f"/ws/events/?after={second}", user)
        assert (await again.connect())[0]
        assert [e["seq"] for e in await collect(again, 1)] == [third]
        await again.disconnect()
        return first

    assert asyncio.run(scenario()) > 0


def test_stream_refuses_anonymous_clients():
    async def scenario():
        communicator = await connect("/ws/events/", AnonymousUser())
        connected, code = await communicator.connect()
        assert not connected and code == 4401

    asyncio.run(scenario())
