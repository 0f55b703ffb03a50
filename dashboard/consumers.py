"""WebSocket consumers, fed by the web process's relay (dashboard.relay), never by polling.

- ``/ws/events/?after=SEQ``: engine events as JSON frames, in order, resumable.
- ``/ws/live/?topic=jobs|cluster|job.N&after=SEQ&...``: a page's live fragments as htmx
  out-of-band swaps (htmx's ``ws`` extension swaps them in), re-rendered when an event of the
  page's topic arrives. Each message ends with the ``seq`` it brings the page to; a page that
  reconnects passes it back and misses nothing.

Both catch up from the database first (events after the client's ``seq``), then follow the
relay; an event is applied once (by ``seq``), and a relay message that says it follows an event
this socket never saw (the layer dropped one) makes it catch up from the database again.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer

from dashboard import live, relay
from engine import queries
from engine.api.serializers.events import EngineEventSerializer
from engine.roles import VIEW_JOB


async def _allowed(consumer) -> bool:
    user = consumer.scope.get("user")
    if user is None or not user.is_authenticated:
        await consumer.close(code=4401)
        return False
    if not await database_sync_to_async(user.has_perm)(VIEW_JOB):
        await consumer.close(code=4403)
        return False
    return True


def _query(scope) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}


def _after(query: dict[str, str]) -> int | None:
    try:
        return max(int(query.get("after", "0")), 0)
    except ValueError:
        return None


class EventStreamConsumer(AsyncJsonWebsocketConsumer):
    """Sends ``{type: "engine.events", events: [...], nextAfter}`` frames."""

    async def connect(self):
        if not await _allowed(self):
            return
        self.after = _after(_query(self.scope))
        if self.after is None:
            await self.close(code=4400)
            return
        await self.channel_layer.group_add("events", self.channel_name)
        await self.accept()
        await database_sync_to_async(relay.ensure_started)()
        await self.catch_up()

    async def disconnect(self, code):
        await self.channel_layer.group_discard("events", self.channel_name)

    @database_sync_to_async
    def _page(self, after: int) -> list[dict]:
        return EngineEventSerializer(queries.events_after(after), many=True).data

    async def catch_up(self) -> None:
        while events := await self._page(self.after):
            await self._send(events)

    async def _send(self, events: list[dict]) -> None:
        self.after = events[-1]["seq"]
        await self.send_json({"type": "engine.events", "events": events, "nextAfter": self.after})

    async def relay_events(self, message):
        if message.get("follows", 0) > self.after:
            await self.catch_up()  # something between was dropped on the way: read it
            return
        events = [e for e in message["events"] if e["seq"] > self.after]
        if events:
            await self._send(events)


class LiveConsumer(AsyncWebsocketConsumer):
    """A page's live fragments (dashboard.live renders them), for its topic."""

    async def connect(self):
        if not await _allowed(self):
            return
        query = _query(self.scope)
        self.after = _after(query)
        self.topic = live.topic(query.get("topic", ""))
        if self.after is None or self.topic is None:
            await self.close(code=4400)
            return
        self.query = query
        await self.channel_layer.group_add(self.topic, self.channel_name)
        await self.accept()
        await database_sync_to_async(relay.ensure_started)()
        latest = await database_sync_to_async(queries.latest_seq)()
        if latest > self.after:  # it changed while the page was away: bring it up to date
            await self.render(latest)

    async def disconnect(self, code):
        topic = getattr(self, "topic", None)
        if topic:
            await self.channel_layer.group_discard(topic, self.channel_name)

    async def render(self, seq: int) -> None:
        html = await database_sync_to_async(live.fragments)(
            self.topic, self.query, self.scope["user"], seq
        )
        self.after = seq
        await self.send(text_data=html)

    async def relay_events(self, message):
        if message["seq"] > self.after:
            await self.render(message["seq"])

    async def relay_samples(self, message):
        """New throughput samples: redraw rows/s and the sparkline (same seq)."""
        await self.render(self.after)
