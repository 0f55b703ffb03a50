"""The Celery application: broker and queues for member commands and durable control steps.

Loaded with the settings package and made the default app, so it is every thread's current
app: the engine sends by task name through ``celery.current_app`` and never imports this
module. Each side registers its handlers: members the commands they receive, the master side
the control steps any worker runs.
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

from engine.protocol import CONTROL_QUEUE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keel.settings")

app = Celery("keel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [Queue(CONTROL_QUEUE)]
app.conf.worker_consumer = "keel.celery_consumer:PromptConsumer"  # reconnects within 1 s
# ... for as long as the broker is away (Celery's default gives up after 100 attempts).
app.conf.broker_connection_max_retries = None
app.autodiscover_tasks(["engine.member", "engine.master"], related_name="handlers")
# The current app of every thread (web views, a worker's own threads), not just this one's.
app.set_default()
