"""WebSocket consumers. ``/ws/events/?after=SEQ`` streams engine events in order, resumable."""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from engine import queries
from engine.api.serializers.events import EngineEventSerializer
from engine.roles import VIEW_JOB

POLL_SECONDS = 0.5


class EventStreamConsumer(AsyncJsonWebsocketConsumer):
    """Sends ``{type: "engine.events", events: [...], nextAfter}`` frames.

    A client that reconnects passes the last ``seq`` it saw and loses nothing: seq values commit
    in order (engine.events), so reading ``seq > after`` never skips an event.
    """

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        if not await database_sync_to_async(user.has_perm)(VIEW_JOB):
            await self.close(code=4403)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            self.after = max(int(query.get("after", ["0"])[0]), 0)
        except ValueError:
            await self.close(code=4400)
            return
        await self.accept()
        self.task = asyncio.ensure_future(self.pump())

    async def disconnect(self, code):
        task = getattr(self, "task", None)
        if task is not None:
            task.cancel()

    @database_sync_to_async
    def _page(self, after: int) -> list[dict]:
        return EngineEventSerializer(queries.events_after(after), many=True).data

    async def pump(self):
        while True:
            events = await self._page(self.after)
            if events:
                self.after = events[-1]["seq"]
                await self.send_json(
                    {"type": "engine.events", "events": events, "nextAfter": self.after}
                )
            else:
                await asyncio.sleep(POLL_SECONDS)
