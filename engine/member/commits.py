"""A reader's side of checkpoint commits: durable, in order, up to the newest completed.

The record of a commit to make is the COMPLETED checkpoint row and this attempt's ack in it; the
commit command is only a hint. A reader applies the newest completed checkpoint it acked when
told, and on its own every POLL_INTERVAL from its newest ack on, so a dropped or lost command (a
full mailbox, a broker outage, a master that died) delays a commit by that much at most; while
the commands come, the poll asks nothing. Committing N commits every earlier checkpoint too. A
checkpointed batch reader that has read all its input ends only once
the checkpoint whose snapshot holds its end (its final checkpoint) is committed: a restore
never replays what it committed, and it commits nothing no checkpoint covers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import monotonic

from engine.jobs import checkpoints, lifecycle
from engine.member.dataplane import Chain, guarded

log = logging.getLogger("keel.commits")
POLL_INTERVAL = 0.5


class ReaderCommits:
    def __init__(
        self,
        task_group_id: int,
        attempt: int,
        member_id: int,
        *,
        checkpointing: bool,
        restored: int | None,
        db: Callable = lambda what, call, *args: call(*args),
    ) -> None:
        self.task_group_id = task_group_id
        self.attempt = attempt
        self.member_id = member_id
        self.checkpointing = checkpointing
        #: The newest checkpoint whose sink states are committed (the sinks' constructors
        #: commit the one a restore starts from).
        self.committed = restored or 0
        #: The first checkpoint whose snapshot has every split of this reader read to the end.
        self.final: int | None = None
        self.input_ended = False
        #: The newest checkpoint this attempt acked: none newer than it can complete for us.
        self.acked = self.committed
        self.next_poll = 0.0
        #: How calls to the engine's database are made (the task group's, riding out outages).
        self.db = db

    def acknowledge(self, checkpoint_id: int, state: dict) -> bool:
        """This attempt's snapshot for a checkpoint (``checkpoints.acknowledge``); True once it
        is recorded. Every ack of a reader goes through here: an ack not seen here would make
        its poll skip a checkpoint that completes for it."""
        recorded = self.db(
            "acknowledging a barrier",
            checkpoints.acknowledge,
            checkpoint_id,
            self.task_group_id,
            self.attempt,
            state,
        )
        if recorded:
            if self.acked <= self.committed:
                # Nothing was waiting: the commit command usually comes before the poll is due
                # (a hundred readers polling twice a second cost more than their data).
                self.next_poll = monotonic() + POLL_INTERVAL
            self.acked = max(self.acked, checkpoint_id)
        return recorded

    def on_barrier(self, checkpoint_id: int, positions: dict) -> None:
        if self.final is None and all(p["done"] for p in positions.values()):
            self.final = checkpoint_id

    def apply(self, chain: Chain, now: bool = False) -> None:
        """Commit the newest completed checkpoint not committed yet: at once when ``now``,
        else at most every POLL_INTERVAL."""
        if not self.checkpointing or self.acked <= self.committed:
            return  # nothing this attempt acked is uncommitted: no checkpoint can be ours
        clock = monotonic()
        if not now and clock < self.next_poll:
            return
        self.next_poll = clock + POLL_INTERVAL
        found = self.db(
            "finding completed checkpoints",
            checkpoints.completed_since,
            self.task_group_id,
            self.attempt,
            self.committed,
        )
        if found is None:
            return
        checkpoint_id, state = found
        for (path, _, writer), sink_state in zip(chain.sinks, state.get("sinks", []), strict=False):
            guarded(path, writer.commit, sink_state)
        self.committed = checkpoint_id
        self.db(
            "recording a commit",
            checkpoints.record_commit,
            checkpoint_id,
            self.task_group_id,
            self.attempt,
        )

    def input_done(self, chain: Chain) -> bool:
        """Called while a batch reader whose input is read idles: may it end now?"""
        if not self.checkpointing:
            return True
        if not self.input_ended:
            self.input_ended = True
            self.db(
                "reporting its input read",
                lifecycle.mark_input_ended,
                self.task_group_id,
                self.attempt,
                self.member_id,
            )
        self.apply(chain)
        return self.final is not None and self.committed >= self.final

    def on_stopped(self, chain: Chain) -> None:
        """Cancelled (or fenced): what completed is committed before the sinks are aborted."""
        try:
            self.apply(chain, now=True)
        except Exception:
            log.warning("task group %s could not commit on stop", self.task_group_id, exc_info=True)


def for_reader(thread, group, restored: int | None) -> tuple[ReaderCommits, dict]:
    """A reader attempt's commits (``thread``: its task group thread) and the context its
    sinks are opened with, restored from checkpoint ``restored`` (None: from the start)."""
    checkpointing = bool(group.job.env.get("checkpoint.interval"))
    commits = ReaderCommits(
        thread.task_group_id,
        thread.attempt,
        thread.member_id,
        checkpointing=checkpointing,
        restored=restored,
        db=thread.db,
    )
    context = {
        "jobId": group.job_id,
        "jobUuid": str(group.job.uuid) if group.job.uuid else None,
        "pipelineId": group.pipeline.index,
        "readerIndex": group.index,
        "attempt": thread.attempt,
        "memberUuid": str(thread.runtime.member.uuid),
        "jobName": group.job.name,
        "checkpointing": checkpointing,
        "checkpointInterval": group.job.env.get("checkpoint.interval"),
        "checkpointTimeout": group.job.env.get("checkpoint.timeout"),
        "restoredCheckpoint": restored,
    }
    return commits, context
