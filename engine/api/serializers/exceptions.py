"""Serializers of a job's exception history."""

from __future__ import annotations

from rest_framework import serializers


class ExceptionMemberSerializer(serializers.Serializer):
    uuid = serializers.UUIDField()
    name = serializers.CharField()


class JobExceptionSerializer(serializers.Serializer):
    """A failed task group attempt as engine.jobs.exceptions.recent makes it."""

    exceptionId = serializers.IntegerField()
    at = serializers.DateTimeField()
    pipelineId = serializers.IntegerField(allow_null=True, help_text="the pipeline's index")
    taskGroupId = serializers.IntegerField(allow_null=True)
    taskGroup = serializers.CharField(
        allow_null=True, help_text='its kind and index, e.g. "reader 0" or "enumerator 0"'
    )
    attempt = serializers.IntegerField()
    member = ExceptionMemberSerializer(
        allow_null=True, help_text="the worker that ran it (for a member loss, the lost one)"
    )
    memberName = serializers.CharField(
        allow_blank=True, help_text="the member's name when it failed (kept if the member goes)"
    )
    error = serializers.CharField(allow_blank=True)
    traceback = serializers.CharField(
        allow_blank=True, help_text="the worker's traceback, its last 16 KB (empty for a loss)"
    )
    memberLost = serializers.BooleanField(help_text="it failed because its member was lost")
    causedRestore = serializers.BooleanField(
        help_text="the master restored its pipeline after it (rather than failing the job)"
    )
