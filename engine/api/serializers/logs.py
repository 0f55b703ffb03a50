"""Serializers of a job's task log lines (engine.jobs.tasklog_reading)."""

from __future__ import annotations

from rest_framework import serializers

from engine.jobs import tasklog_reading
from engine.models import TaskGroup, TaskLogLine

DEFAULT_LIMIT = 500
MAX_LIMIT = 2000
#: Ids are bigints.
MAX_ID = 2**63 - 1


class TaskLogQuerySerializer(serializers.Serializer):
    """``?taskGroup=&level=&after=&limit=``; the job is the serializer's ``job_id`` context."""

    taskGroup = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_ID,
        help_text="only this task group's lines (one of the job's)",
    )
    level = serializers.CharField(
        required=False,
        help_text="the minimum level: DEBUG, INFO, WARNING, ERROR, CRITICAL (any case) or a number",
    )
    after = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_ID,
        help_text="only lines after this lineId, oldest first",
    )
    limit = serializers.IntegerField(
        required=False, default=DEFAULT_LIMIT, min_value=1, max_value=MAX_LIMIT
    )

    def validate_taskGroup(self, value: int) -> int:
        job_id = self.context["job_id"]
        # Its lines outlive the task group row (cleaned up with the job's running state).
        if not (
            TaskGroup.objects.filter(id=value, job_id=job_id).exists()
            or TaskLogLine.objects.filter(job_id=job_id, task_group_id=value).exists()
        ):
            raise serializers.ValidationError(f"task group {value} is not one of job {job_id}'s")
        return value

    def validate_level(self, value: str) -> int:
        try:
            return tasklog_reading.parse_level(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class TaskLogLineSerializer(serializers.Serializer):
    lineId = serializers.IntegerField()
    at = serializers.DateTimeField()
    taskGroupId = serializers.IntegerField()
    attempt = serializers.IntegerField()
    level = serializers.CharField(help_text="the level's name (INFO, WARNING, ...)")
    logger = serializers.CharField()
    message = serializers.CharField()


class TaskLogPageSerializer(serializers.Serializer):
    results = TaskLogLineSerializer(many=True)
    nextAfter = serializers.IntegerField(
        allow_null=True, help_text="the last lineId given (pass it as ?after= to poll for more)"
    )
