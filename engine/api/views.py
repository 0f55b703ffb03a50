"""Cluster endpoints: overview, members, events. Views validate and read; they change nothing."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import queries

from .filters import MemberFilter
from .serializers import (
    EngineEventSerializer,
    EventPageSerializer,
    EventQuerySerializer,
    MemberSerializer,
    OverviewSerializer,
    SlotSerializer,
)


class OverviewView(APIView):
    @extend_schema(responses=OverviewSerializer, operation_id="overview")
    def get(self, request: Request) -> Response:
        return Response(OverviewSerializer(queries.overview()).data)


class MemberListView(generics.ListAPIView):
    """Every member, newest first; ``?state=ALIVE|REMOVED|LEFT`` filters."""

    serializer_class = MemberSerializer
    filterset_class = MemberFilter
    pagination_class = None

    def get_queryset(self):
        return queries.members()


class SlotListView(APIView):
    """Every slot of every ALIVE member, with its state and owner."""

    @extend_schema(responses=SlotSerializer(many=True), operation_id="slots_list")
    def get(self, request: Request) -> Response:
        return Response(SlotSerializer(queries.slots(), many=True).data)


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
