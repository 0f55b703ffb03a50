"""Cluster endpoints: overview, members, slots. Views validate and read; they change nothing."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import queries
from engine.api.filters import MemberFilter
from engine.api.serializers.cluster import MemberSerializer, OverviewSerializer, SlotSerializer


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
