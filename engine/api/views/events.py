"""The event store, paged by ``seq``."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import queries
from engine.api.serializers.events import (
    EngineEventSerializer,
    EventPageSerializer,
    EventQuerySerializer,
)


class EventListView(APIView):
    """Engine events in ``seq`` order after ``?after=SEQ``; at most 500 a page."""

    @extend_schema(
        parameters=[EventQuerySerializer],
        responses=EventPageSerializer,
        operation_id="events_list",
    )
    def get(self, request: Request) -> Response:
        query = EventQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        after = query.validated_data["after"]
        events = queries.events_after(after, query.validated_data["limit"])
        return Response(
            {
                "results": EngineEventSerializer(events, many=True).data,
                "nextAfter": events[-1].seq if events else after,
            }
        )
