"""Cluster endpoints: overview, members, slots, drains. Views validate, read, and call the
domain's actions (engine.jobs.drain) for the one change they allow."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import queries
from engine.api.filters import MemberFilter
from engine.api.serializers.cluster import MemberSerializer, OverviewSerializer, SlotSerializer
from engine.api.serializers.drain import DrainRequestSerializer, DrainSerializer
from engine.jobs.drain import DrainRefused, request_drain
from engine.models import Member
from engine.roles import DRAIN_MEMBER


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


class MemberDrainView(APIView):
    """A member's planned leave: ``POST`` drains it (operators; ``reason`` is required and
    audited with the user), ``GET`` lists its drains, newest first."""

    role_permissions = {"POST": DRAIN_MEMBER}

    @extend_schema(responses=DrainSerializer(many=True), operation_id="members_drains")
    def get(self, request: Request, member_uuid) -> Response:
        member = get_object_or_404(Member, uuid=member_uuid)
        drains = member.drains.select_related("member").order_by("-id")
        return Response(DrainSerializer(drains, many=True).data)

    @extend_schema(
        request=DrainRequestSerializer,
        responses={202: DrainSerializer, 200: DrainSerializer},
        operation_id="members_drain",
    )
    def post(self, request: Request, member_uuid) -> Response:
        body = DrainRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            drain, created = request_drain(
                member_uuid,
                request.user,
                body.validated_data["reason"],
                body.validated_data["force"],
            )
        except DrainRefused as exc:
            return Response({"detail": str(exc)}, status=exc.status)
        return Response(
            DrainSerializer(drain).data,
            status=status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK,
        )
