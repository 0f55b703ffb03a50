"""When the master ends a checkpoint of a Lane A pipeline without completing it, the attempts it
expected that still run are told (``engine.checkpoint.abort``): a Lane A reader's event loop
gets a CHECKPOINT_ABORT control, its enumerator takes back what the snapshots proved; Lane B
task groups are not told. On real PostgreSQL and Redis, through the master's own step and its
outbox."""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import pytest
import redis
from django.utils import timezone

from engine.jobs import checkpoints
from engine.jobs.submission import submit_job
from engine.master import commands, orchestration
from engine.member.mailbox import Abort, Barrier
from engine.member.managed_reader import ManagedReaderTask
from engine.models import Checkpoint, TaskGroup
from engine.protocol import TASK_ABORT, TASK_BARRIER, TASK_COMMIT, member_queue
from engine.sourceruntime.choices import CommandKind
from engine.sourceruntime.limits import MailboxLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from tests.brokerkit import take_commands

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_failed_checkpoint_is_aborted_at_the_attempts_it_expected(engine, settings):
    member = engine.add_member(slots=12)
    broker = redis.Redis.from_url(settings.REDIS_URL)
    queue = member_queue(member.name)
    for lane_a in (True, True, False):  # the first times out, the second completes
        connectors = ["FakeSource"] if lane_a else []
        settings.ENGINE = {**settings.ENGINE, "source-runtime.managed-connectors": connectors}
        submit_job(
            "env { job.mode = STREAMING, parallelism = 2, checkpoint.interval = 60000,"
            " checkpoint.timeout = 1000 }\nsource { FakeSource { } }\nsink { Blackhole { } }"
        )
        engine.schedule()
    engine.run_deployed()
    barriers = checkpoints.trigger_due(engine.epoch)
    (timed_out, completes, lane_b) = sorted({checkpoint_id for checkpoint_id, _ in barriers})
    assert Checkpoint.objects.get(id=lane_b).pipeline.plan["sourceRuntime"]["lane"] == "B"
    for checkpoint_id, target in barriers:
        if checkpoint_id == completes:
            checkpoints.acknowledge(checkpoint_id, target.task_group_id, target.attempt, {})
    expected = Checkpoint.objects.get(id=timed_out).expected
    redeployed = int(min(expected))  # one of its task groups moved on: it is not told
    TaskGroup.objects.filter(id=redeployed).update(attempt=2)
    Checkpoint.objects.filter(id__in=(timed_out, lane_b)).update(
        triggered_at=timezone.now() - timedelta(seconds=5)
    )
    assert commands.outbox.flush(5)
    broker.delete(queue)
    orchestration.coordinate_checkpoints(engine.epoch, trigger=False)
    assert commands.outbox.flush(5)
    sent = take_commands(broker, queue)
    aborts = sorted((args[0], args[1], args[3]) for task, args in sent if task == TASK_ABORT)
    told = sorted((int(g), a, timed_out) for g, a in expected.items() if int(g) != redeployed)
    assert aborts == told and len(aborts) == 2  # not the redeployed one
    assert {task for task, _ in sent} <= {TASK_ABORT, TASK_COMMIT, TASK_BARRIER}
    assert [Checkpoint.objects.get(id=c).state for c in (timed_out, completes, lane_b)] == [
        "FAILED",
        "COMPLETED",
        "FAILED",  # its task groups are Lane B's: not told
    ]


def test_a_lane_a_reader_takes_an_abort_as_an_ordered_control_after_its_barrier():
    task = ManagedReaderTask(SimpleNamespace(attempt=2), SimpleNamespace(id=5), WorkerBudget(10**9))
    task.mailbox = ReaderMailbox(1, "1/0", 2, MailboxLimits(), WorkerBudget(10**9))
    assert task.offer(Barrier(8)) and task.offer(Abort(8))
    assert task.offer(Abort(8))  # repeated: acknowledged, not queued twice
    kinds = []
    while (queued := task.mailbox.take()) is not None:
        kinds.append((queued.envelope.kind, json.loads(queued.envelope.payload)["checkpoint"]))
    assert kinds == [(CommandKind.CHECKPOINT, 8), (CommandKind.CHECKPOINT_ABORT, 8)]
