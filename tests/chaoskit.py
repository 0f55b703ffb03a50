"""Chaos: a cluster on a private PostgreSQL and a private Redis, a streaming job writing a
keyless Jdbc target, and a batch job per fault; each fault in turn, then the data checked.

Used by tests/test_chaos.py (asserts) and bench/chaos (prints). The engine's database is on the
private server (the PostgreSQL restart hits it); the batch jobs' tables live on the machine's
shared server (written through the staging table), the streaming job's on a third server that
allows prepared transactions (``is_exactly_once``: two-phase commits), so the data is checked
across every fault of the engine's own, through both exactly-once writers.
"""

from __future__ import annotations

import contextlib
import json
import signal
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg

from tests.clusterkit import SERVER_URL, Cluster, DatabaseTemplate, admin_conn, wait_for
from tests.faultkit import PrivatePostgres, PrivateRedis
from tests.test_jobs_cluster import job, post

SPLITS = 2
BATCH_ROWS = 3000  # per reader (2 readers, 2 splits each), paced: runs through the fault
STREAMING = """
env {{ job.mode = STREAMING, parallelism = 2, checkpoint.interval = 500,
      job.retry.interval.seconds = 0, job.retry.times = 100 }}
source {{ FakeSource {{ split.num = {splits}, rows.per-second = 300, endless = true,
                       schema {{ fields {{ id = bigint, name = string }} }} }} }}
sink {{ Jdbc {{ url = "{url}", user = postgres, password = t, table = stream,
              is_exactly_once = true }} }}
"""
BATCH = """
env {{ job.mode = BATCH, parallelism = 2, checkpoint.interval = 500,
      job.retry.interval.seconds = 0, job.retry.times = 100 }}
source {{ FakeSource {{ split.num = {splits}, row.num = {rows}, rows.per-second = 400,
                       schema {{ fields {{ id = bigint, name = string }} }} }} }}
sink {{ Jdbc {{ url = "{url}", user = root, password = t, table = {table} }} }}
"""


@dataclass
class Outcome:
    """What one fault cost: seconds until the streaming job committed a checkpoint again
    after the fault ended, restores it caused (both jobs), rows lost and duplicated (both
    jobs), and whether everything settled (no pipeline stuck, no slot leaked)."""

    fault: str
    flows_again: float
    restores: int
    lost: int
    duplicated: int
    settled: bool
    stuck: str = ""  # what was seen last when it did not settle
    #: Seconds the fault itself lasted (from its start to its healing).
    lasted: float = 0.0
    #: Master writes that landed after a newer master's (at some instant two masters whose
    #: writes both land): 0 unless fencing failed.
    dual_writes: int = 0

    @property
    def clean(self) -> bool:
        return (self.lost, self.duplicated, self.settled, self.dual_writes) == (0, 0, True, 0)


class Chaos:
    def __init__(
        self, cluster: Cluster, postgres: PrivatePostgres, redis, data_url: str, stream_url: str
    ) -> None:
        self.c, self.postgres, self.redis, self.data_url = cluster, postgres, redis, data_url
        self.jdbc = "jdbc:" + data_url.replace("postgres://", "postgresql://")
        #: The streaming job's target, written with two-phase commits (is_exactly_once).
        self.stream_url = stream_url
        self.stream_job = 0
        self.batches = 0
        self.batch_job = 0  # the running fault's

    # -- the jobs -------------------------------------------------------------------------

    def submit(self, config: str) -> int:
        code, body = post(self.c, "/api/v1/jobs", {"config": config})
        assert code == 201, body
        return body["jobId"]

    def start_streaming(self) -> None:
        with psycopg.connect(self.stream_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE stream (id bigint, name text)")
        jdbc = "jdbc:" + self.stream_url.replace("postgres://postgres@", "postgresql://")
        self.stream_job = self.submit(STREAMING.format(splits=SPLITS, url=jdbc))
        self.wait_flowing(time.monotonic())

    def start_batch(self) -> tuple[int, str]:
        self.batches += 1
        table = f"batch_{self.batches}"
        with psycopg.connect(self.data_url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (id bigint, name text)")
        job_id = self.submit(
            BATCH.format(splits=SPLITS, rows=BATCH_ROWS, url=self.jdbc, table=table)
        )
        wait_for(
            lambda: job(self.c, job_id)["metrics"]["sourceReceivedCount"] > 0,
            30,
            interval=0.1,
            what="the batch job to read",
        )
        return job_id, table

    def restores(self) -> int:
        """Restores so far, from the engine's own totals: pipelines' counters go with the rows
        that cleanup removes, these do not."""
        return self.c.one(
            "SELECT coalesce(sum(value), 0)::int FROM engine_metrictotal WHERE name = 'restores'"
        )

    def removals(self) -> int:
        """Members removed so far (a member that held nothing costs no restore)."""
        return self.c.one("SELECT count(*) FROM engine_member WHERE state = 'REMOVED'")

    def committed_after(self, since_wall: float) -> bool:
        """Some reader of the streaming job committed a checkpoint after ``since_wall``."""
        return bool(
            self.c.one(
                "SELECT count(*) FROM engine_taskcheckpoint a JOIN engine_taskgroup g"
                " ON g.id = a.task_group_id WHERE g.job_id = %s AND a.committed_at"
                " > to_timestamp(%s)",
                (self.stream_job, since_wall),
            )
        )

    def wait_flowing(self, since: float, timeout: float = 60) -> float:
        """Seconds from ``since`` (monotonic) until the streaming job commits a checkpoint."""
        wall = time.time() - (time.monotonic() - since)
        wait_for(lambda: self.committed_after(wall), timeout, interval=0.05, what="data flowing")
        return time.monotonic() - since

    # -- the data ---------------------------------------------------------------------------

    def _offsets(self, condition: str) -> dict[int, int]:
        """{split index: offset} of the newest ack per reader matching ``condition``."""
        rows = self.c.query(
            "SELECT DISTINCT ON (a.task_group_id) a.state FROM engine_taskcheckpoint a"
            " JOIN engine_taskgroup g ON g.id = a.task_group_id"
            " JOIN engine_checkpoint k ON k.id = a.checkpoint_id"
            f" WHERE g.job_id = %s AND g.kind = 'READER' AND {condition}"
            " ORDER BY a.task_group_id, a.checkpoint_id DESC",
            (self.stream_job,),
        )
        offsets = {s: 0 for s in range(SPLITS)}
        for (state,) in rows:
            state = json.loads(state) if isinstance(state, str) else state
            for split_id, position in state["splits"].items():
                offsets[int(split_id.rsplit("-", 1)[1])] = position["offset"]
        return offsets

    def streaming_damage(self) -> tuple[int, int]:
        """(rows lost, rows duplicated) in the streaming target: every row up to the cut its
        readers last recorded committing must be there once, none beyond the newest completed
        checkpoint's cut (read in that order, so both bounds hold at the moment of reading).
        Split ``s`` holds ids ``s, s + SPLITS, s + 2 * SPLITS, ...`` (FakeSource)."""
        committed = self._offsets("a.committed_at IS NOT NULL")
        with psycopg.connect(self.stream_url) as conn:
            seen = [
                conn.execute(
                    "SELECT count(*), count(DISTINCT id), max(id),"
                    " count(DISTINCT id) FILTER (WHERE id < %s) FROM stream WHERE id %% %s = %s",
                    (split + committed[split] * SPLITS, SPLITS, split),
                ).fetchone()
                for split in range(SPLITS)
            ]
        completed = self._offsets("k.state = 'COMPLETED'")
        lost = duplicated = 0
        for split, (count, distinct, highest, below) in enumerate(seen):
            duplicated += count - distinct
            lost += committed[split] - below
            cut = split + max(completed[split], committed[split]) * SPLITS
            assert highest is None or highest < cut, f"split {split}: row {highest} beyond {cut}"
        return lost, duplicated

    def batch_damage(self, table: str) -> tuple[int, int]:
        with psycopg.connect(self.data_url) as conn:
            count, distinct, inside = conn.execute(
                f"SELECT count(*), count(DISTINCT id),"
                f" count(DISTINCT id) FILTER (WHERE id >= 0 AND id < %s) FROM {table}",
                (SPLITS * BATCH_ROWS,),
            ).fetchone()
        return SPLITS * BATCH_ROWS - inside, count - distinct

    def settled(self, batch_job: int, timeout: float = 120) -> str:
        """Empty once the batch job FINISHED, the streaming job's pipeline is RUNNING and every
        assigned slot is held by a live task group; else what was seen last (a STUCK outcome
        then says which part of the engine waited)."""
        seen = {"last": ""}

        def done() -> bool:
            batch = job(self.c, batch_job)["jobStatus"]
            stream = job(self.c, self.stream_job)["pipelines"][0]["status"]
            # Every assigned slot of a live member held by exactly one live task group, and
            # every live task group on an assigned slot (counts alone could cancel out).
            live = "t.status IN ('DEPLOYING', 'RUNNING', 'FAILING', 'CANCELING')"
            leaked, doubled, unassigned, adrift = self.c.query(
                "SELECT (SELECT count(*) FROM engine_slot s JOIN engine_member m"
                " ON m.id = s.member_id WHERE m.state = 'ALIVE' AND s.state = 'ASSIGNED'"
                f" AND NOT EXISTS (SELECT 1 FROM engine_taskgroup t WHERE t.slot_id = s.id"
                f" AND {live})),"
                f" (SELECT count(*) FROM (SELECT t.slot_id FROM engine_taskgroup t WHERE {live}"
                " AND t.slot_id IS NOT NULL GROUP BY t.slot_id HAVING count(*) > 1) d),"
                " (SELECT count(*) FROM engine_taskgroup t JOIN engine_slot s ON s.id = t.slot_id"
                f" WHERE {live} AND s.state <> 'ASSIGNED'),"
                " (SELECT count(*) FROM engine_taskgroup t LEFT JOIN engine_slot s"
                " ON s.id = t.slot_id LEFT JOIN engine_member m ON m.id = s.member_id"
                f" WHERE {live} AND (t.slot_id IS NULL OR m.state <> 'ALIVE'))"
            )[0]
            seen["last"] = (
                f"batch job {batch}, streaming pipeline {stream}, {leaked} assigned slots with"
                f" no live task group, {doubled} held twice, {unassigned} task groups on a"
                f" slot not assigned, {adrift} live with no slot of a live member;"
                f" {self.unfinished(batch_job)}"
            )
            return (
                batch == "FINISHED"
                and stream == "RUNNING"
                and not (leaked or doubled or unassigned or adrift)
            )

        try:
            wait_for(done, timeout, interval=0.2, what="the cluster to settle")
            return ""
        except AssertionError:
            return seen["last"]

    def unfinished(self, batch_job: int) -> str:
        """The batch job's task groups and newest checkpoints, in a line."""
        groups = self.c.query(
            "SELECT t.id, t.kind, t.status, t.attempt, m.name, m.state FROM engine_taskgroup t"
            " LEFT JOIN engine_member m ON m.id = t.member_id WHERE t.job_id = %s ORDER BY t.id",
            (batch_job,),
        )
        cuts = self.c.query(
            "SELECT id, state FROM engine_checkpoint WHERE job_id = %s ORDER BY id DESC LIMIT 3",
            (batch_job,),
        )
        # What the engine did last about it, and its control steps: why it waits.
        events = self.c.query(
            "SELECT kind, epoch FROM engine_engineevent WHERE job_id = %s"
            " AND kind NOT LIKE 'checkpoint.%%' ORDER BY seq DESC LIMIT 8",
            (batch_job,),
        )
        steps = self.c.query(
            "SELECT kind, state, attempts, left(result, 120) FROM engine_controlstep"
            " WHERE job_id = %s ORDER BY id DESC LIMIT 4",
            (batch_job,),
        )
        return (
            "task groups "
            + ", ".join(f"{g[0]} {g[1]} {g[2]} #{g[3]} on {g[4]} ({g[5]})" for g in groups)
            + "; checkpoints "
            + (", ".join(f"{c[0]} {c[1]}" for c in cuts) or "none")
            + "; newest events "
            + ", ".join(f"{k} (epoch {e})" for k, e in events)
            + "; control steps "
            + (", ".join(f"{k} {st} x{n} {r!r}" for k, st, n, r in steps) or "none")
        )

    # -- one fault ----------------------------------------------------------------------------

    def run(self, name: str, fault: Callable[[Chaos], None]) -> Outcome:
        self.c.restore()
        wait_for(self.c.active_master, 20, what="an active master")
        self.wait_flowing(time.monotonic())
        batch_job, table = self.start_batch()
        self.batch_job = batch_job
        restores = self.restores()
        since = self.c.one("SELECT coalesce(max(seq), 0) FROM engine_engineevent")
        started = time.monotonic()
        fault(self)
        ended = time.monotonic()
        self.c.restore()
        flows_again = self.wait_flowing(ended)
        stuck = self.settled(batch_job)
        lost, duplicated = self.streaming_damage()
        batch_lost, batch_duplicated = self.batch_damage(table)
        return Outcome(
            name,
            flows_again,
            self.restores() - restores,
            lost + batch_lost,
            duplicated + batch_duplicated,
            not stuck,
            stuck,
            dual_writes=self.dual_master_writes(since),
            lasted=ended - started,
        )

    def dual_master_writes(self, since: int) -> int:
        """Events written on behalf of a master (after event ``since``) that landed after an
        event of a newer master's epoch: event ids commit in order (engine.events), so an old
        master's write that got through after a takeover shows as a fall in epoch."""
        return self.c.one(
            "SELECT count(*) FROM (SELECT epoch, max(epoch) OVER (ORDER BY seq ROWS BETWEEN"
            " UNBOUNDED PRECEDING AND 1 PRECEDING) AS newest FROM engine_engineevent"
            " WHERE seq > %s AND epoch IS NOT NULL) e WHERE epoch < newest",
            (since,),
        )

    def reader_worker(self) -> str:
        groups = job(self.c, self.stream_job)["pipelines"][0]["taskGroups"]
        return next(g for g in groups if g["kind"] == "READER")["member"]["name"]


# -- the faults -----------------------------------------------------------------------------


def kill_a_worker(chaos: Chaos) -> None:
    victim = chaos.reader_worker()
    chaos.c.signal(victim, signal.SIGKILL)
    wait_for(lambda: not chaos.c.alive(victim), 10, what="the worker to die")


def freeze_a_worker(chaos: Chaos) -> None:
    """SIGSTOP past the heartbeat timeout (the member is REMOVED), then SIGCONT: it exits."""
    victim = chaos.reader_worker()
    pid = chaos.c.signal(victim, signal.SIGSTOP)
    try:
        wait_for(
            lambda: chaos.c.one(
                "SELECT count(*) FROM engine_member WHERE pid = %s AND state = 'REMOVED'", (pid,)
            ),
            20,
            interval=0.05,
            what="the frozen member's removal",
        )
    finally:
        chaos.c.signal(victim, signal.SIGCONT)
    wait_for(lambda: not chaos.c.alive(victim), 15, what="the woken worker to exit")


def kill_the_master_twice(chaos: Chaos) -> None:
    for _ in range(2):
        chaos.c.restore()
        epoch, master = wait_for(chaos.c.active_master, 20, what="an active master")
        chaos.c.signal(master, signal.SIGKILL)
        wait_for(
            lambda e=epoch: (a := chaos.c.active_master()) and a[0] > e,
            20,
            what="the next master",
        )


def stop_redis(chaos: Chaos) -> None:
    chaos.redis.stop()
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started >= 10, 15, interval=0.1, what="10 s of outage")
    chaos.redis.start()


def restart_postgres(chaos: Chaos) -> None:
    chaos.c.db.close()
    chaos.postgres.stop()
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started >= 3, 10, interval=0.1, what="3 s of outage")
    chaos.postgres.start()


FAULTS: dict[str, Callable[[Chaos], None]] = {
    "kill -9 a worker": kill_a_worker,
    "SIGSTOP a worker past the heartbeat timeout": freeze_a_worker,
    "kill -9 the active master twice": kill_the_master_twice,
    "stop Redis for 10 s": stop_redis,
    "restart PostgreSQL": restart_postgres,
}


@contextlib.contextmanager
def chaos_cluster() -> Iterator[Chaos]:
    """The cluster on its private services, and a data database on the shared server."""
    data = f"keel_chaos_{time.monotonic_ns()}"
    with admin_conn() as conn:
        conn.execute(f'CREATE DATABASE "{data}"')
    try:
        with (
            PrivatePostgres() as postgres,
            PrivateRedis() as redis,
            # The streaming job's target: a server that allows prepared transactions (the
            # shared one does not) and that no fault restarts (a sink's failure is not a lost
            # member: the job would fail, as Zeta's would).
            PrivatePostgres({"max_prepared_transactions": 16}) as stream_server,
        ):
            with psycopg.connect(f"{stream_server.url}/postgres", autocommit=True) as conn:
                conn.execute("CREATE DATABASE keel_stream")
            template = DatabaseTemplate(postgres.url)
            try:
                with Cluster(
                    template,
                    masters=2,
                    workers=3,
                    slots=4,
                    heartbeat_timeout=2.0,
                    redis_url=redis.url,
                ) as cluster:
                    chaos = Chaos(
                        cluster,
                        postgres,
                        redis,
                        f"{SERVER_URL}/{data}",
                        f"{stream_server.url}/keel_stream",
                    )
                    chaos.start_streaming()
                    yield chaos
            finally:
                with contextlib.suppress(Exception):
                    template.drop_all()
    finally:
        with admin_conn() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{data}" WITH (FORCE)')


def describe(outcome: Outcome) -> str:
    return textwrap.shorten(
        f"{outcome.fault}: data flows again after {outcome.flows_again:.1f} s, "
        f"{outcome.restores} restores, {outcome.lost} rows lost, "
        f"{outcome.duplicated} duplicated, {'settled' if outcome.settled else 'STUCK'}"
        + (f", {outcome.dual_writes} writes of a deposed master" if outcome.dual_writes else ""),
        200,
    ) + (f" ({outcome.stuck})" if outcome.stuck else "")
