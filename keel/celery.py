"""The Celery application: broker and queues for member commands and durable control steps."""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")

app = Celery("keel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [Queue("control")]
app.autodiscover_tasks(["engine.member"], related_name="handlers")


def member_queue(member_name: str) -> str:
    """The queue that carries commands to one member (one worker process)."""
    return f"member.{member_name}"
