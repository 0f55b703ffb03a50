"""The engine's wire/protocol version, reported by every member and master.

Bump it when a change makes members of different versions unable to work together; features
that need the new protocol are refused while an older member is alive (dirty-job tracking is).

``KEEL_PROTOCOL_VERSION`` makes a process announce an older version than its code: it is how a
rolling upgrade is rehearsed (and tested) without keeping old binaries around.
"""

import os

#: 2: dirty-job (recovery-degraded) tracking (engine.dirty).
#: 3: commands to a member batched in one message (TASK_MEMBER_COMMANDS).
#: 4: a sink's writer is named after its job's uuid (engine.connectors.jdbc_writers).
CURRENT_PROTOCOL_VERSION = 4

#: The first protocol version whose members all take part in dirty-job tracking.
DIRTY_TRACKING_SINCE = 2

#: The first protocol version whose members take commands batched in one message.
COMMAND_BATCHES_SINCE = 3

#: The first protocol version whose members name a job's sink writers after its uuid (an older
#: member names them after the job id: the two would not find each other's staged rows).
WRITER_UUID_SINCE = 4

PROTOCOL_VERSION = int(os.environ.get("KEEL_PROTOCOL_VERSION", CURRENT_PROTOCOL_VERSION))

#: The Celery queue that carries durable control steps; every worker consumes it.
CONTROL_QUEUE = "control"


def member_queue(member_name: str) -> str:
    """The Celery queue that carries commands to one member (one worker process)."""
    return f"member.{member_name}"


# Celery task names: the master and members agree on these, never on each other's modules.
TASK_MEMBER_PING = "engine.member.ping"
TASK_DEPLOY = "engine.taskgroup.deploy"
TASK_CANCEL = "engine.taskgroup.cancel"
TASK_BARRIER = "engine.checkpoint.barrier"
TASK_COMMIT = "engine.checkpoint.commit"
#: A checkpoint ended without completing: the task groups it expected are told.
TASK_ABORT = "engine.checkpoint.abort"
TASK_CONTROL_STEP = "engine.control.run"
TASK_PLAN_JOB = "engine.jobs.plan"
TASK_CLEANUP = "engine.cleanup.run"
#: The managed Source runtime (Lane A): an enumerator's command to a reader's mailbox, and the
#: reader's messages back to the enumerator (admission answers, registration, assignment
#: acknowledgements, snapshot reports: engine.member.enumerator_link).
TASK_SOURCE_COMMAND = "engine.source.command"
TASK_SOURCE_ACK = "engine.source.ack"
#: A member drain asks a Lane A reader to close gracefully before it is moved (GRACEFUL_CLOSE:
#: engine.jobs.graceful_close); sent again until the reader's report answers it.
TASK_GRACEFUL_CLOSE = "engine.source.graceful-close"
#: Several of the commands above for one member, in order, in one message: ``[[task, args], ...]``.
TASK_MEMBER_COMMANDS = "engine.member.commands"
