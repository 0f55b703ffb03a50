"""The outbox puts what waits for one member's queue in one message, in order, on real Redis;
the member's handler runs a batch's commands one by one."""

from __future__ import annotations

import redis
from django.conf import settings

from engine.member.handlers import member_commands
from engine.outbox import Outbox, messages_of
from engine.protocol import (
    CONTROL_QUEUE,
    TASK_BARRIER,
    TASK_CANCEL,
    TASK_CONTROL_STEP,
    TASK_MEMBER_COMMANDS,
)
from tests.brokerkit import commands_of, take_commands, take_messages


def test_a_queues_batchable_commands_share_a_message_in_their_order():
    commands = [
        (TASK_BARRIER, [1, 1, "u1", 7], "member.a", True),
        (TASK_BARRIER, [2, 1, "u2", 7], "member.b", True),
        (TASK_CANCEL, [3, 1, "u1"], "member.a", True),
        (TASK_CONTROL_STEP, [9, 4], CONTROL_QUEUE, False),
    ]
    assert messages_of(commands) == [
        (
            TASK_MEMBER_COMMANDS,
            [[[TASK_BARRIER, [1, 1, "u1", 7]], [TASK_CANCEL, [3, 1, "u1"]]]],
            "member.a",
        ),
        (TASK_BARRIER, [2, 1, "u2", 7], "member.b"),  # a batch of one goes as itself
        (TASK_CONTROL_STEP, [9, 4], CONTROL_QUEUE),
    ]


def test_a_command_that_may_not_be_batched_keeps_its_place_in_its_queue():
    """An older member's commands go one a message; a batch never jumps ahead of one."""
    commands = [
        (TASK_BARRIER, [1, 1, "u", 7], "member.a", True),
        (TASK_BARRIER, [1, 1, "u", 7], "member.a", True),
        (TASK_CANCEL, [1, 1, "u"], "member.a", False),
        (TASK_BARRIER, [1, 1, "u", 8], "member.a", True),
    ]
    assert [m[0] for m in messages_of(commands)] == [
        TASK_MEMBER_COMMANDS,
        TASK_CANCEL,
        TASK_BARRIER,
    ]


def test_what_waits_is_published_as_one_message_per_queue():
    broker = redis.Redis.from_url(settings.REDIS_URL)
    queue = "member.outbox-test"
    broker.delete(queue, CONTROL_QUEUE)
    outbox = Outbox()
    outbox.warm()
    barriers = [[group, 1, "uuid", 5] for group in range(50)]
    with outbox._changed:  # the publisher takes nothing until all of them wait
        for args in barriers:
            outbox.put(TASK_BARRIER, args, queue, batch=True)
        outbox.put(TASK_CONTROL_STEP, [1, 2], CONTROL_QUEUE)
    assert outbox.flush(5)
    messages = take_messages(broker, queue)
    assert len(messages) == 1
    assert take_commands(broker, CONTROL_QUEUE) == [(TASK_CONTROL_STEP, [1, 2])]
    assert [args for _, args in commands_of(messages[0])] == barriers


def test_a_batch_runs_every_command_it_can_and_skips_the_rest():
    """Addressed to no member of this process, each command answers "not addressed" and
    counts as run; entries that are not commands, or fail, are logged and skipped."""
    ran = member_commands(
        [
            [TASK_CANCEL, [1, 1, "00000000-0000-0000-0000-000000000000"]],
            ["engine.no-such-command", []],
            "not a command",
            [TASK_CANCEL, [1]],  # wrong arguments: it fails, the next one still runs
            [TASK_BARRIER, [1, 1, "00000000-0000-0000-0000-000000000000", 3]],
        ]
    )
    assert ran == 2
