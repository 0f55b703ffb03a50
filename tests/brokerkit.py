"""What waits on a Celery queue in Redis, read as the commands a consumer would run."""

from __future__ import annotations

import base64
import json

import redis

from engine.protocol import TASK_MEMBER_COMMANDS


def commands_of(message: bytes) -> list[tuple[str, list]]:
    """The (task name, args) one queued message carries: a batch is its commands, in order."""
    envelope = json.loads(message)
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, _kwargs, _embed = json.loads(body)
    task = envelope["headers"]["task"]
    if task == TASK_MEMBER_COMMANDS:
        return [(name, inner) for name, inner in args[0]]
    return [(task, args)]


def take_messages(broker: redis.Redis, queue: str) -> list[bytes]:
    """Every message waiting on ``queue``, oldest first, consumed in one step."""
    with broker.pipeline(transaction=True) as pipe:
        messages, _ = pipe.lrange(queue, 0, -1).delete(queue).execute()
    # Kombu pushes on the left and pops on the right: the oldest is last.
    return list(reversed(messages))


def take_commands(broker: redis.Redis, queue: str) -> list[tuple[str, list]]:
    """Every command waiting on ``queue``, in the order a consumer runs them, consumed."""
    return [command for message in take_messages(broker, queue) for command in commands_of(message)]
