"""Partitions: the chaos cluster (tests.chaoskit) with every master and worker on a test host
of its own (tests.netkit), and the network faults of each scenario.

The engine's PostgreSQL, its Redis and the jobs' PostgreSQL are private servers on the test
network's service address; the web stays on this host (it serves the test's API calls). Both
PostgreSQL servers are reached through each host's relay (tests.linkrelay), so that a host's
link can be slowed, or cut right after a COMMIT. Each scenario is a fault in chaoskit's sense:
``Chaos.run`` starts a batch job, runs the fault to its end, heals, and checks every row once,
nothing stuck, no slot leaked and no deposed master's write landed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import psycopg

from tests.chaoskit import Chaos
from tests.clusterkit import Cluster, DatabaseTemplate, holds_for, wait_for
from tests.faultkit import PrivatePostgres, PrivateRedis
from tests.netkit import Host, Network, healed_after
from tests.test_jobs_cluster import job

T = TypeVar("T", bound=Chaos)
MASTERS, WORKERS = 2, 3
HEARTBEAT_TIMEOUT = 3.0
CLEANUP_DELAY = 6  # seconds: a partition fits inside it


class Partitions(Chaos):
    """The chaos cluster on test hosts, and what its faults need to know of them."""

    def __init__(
        self,
        cluster: Cluster,
        net: Network,
        engine_port: int,
        redis_port: int,
        data_port: int,
        **kw,
    ) -> None:
        super().__init__(cluster, **kw)
        self.net = net
        self.relay = net.relay
        self.engine_port, self.redis_port, self.data_port = engine_port, redis_port, data_port
        self.hosts = {name: net.hosts[i] for i, name in enumerate(process_names())}

    def host(self, process: str) -> Host:
        return self.hosts[process]

    def active_master_host(self) -> tuple[str, Host]:
        _, name = wait_for(self.c.active_master, 20, what="an active master")
        return name, self.host(name)


def process_names() -> list[str]:
    return [f"master-{i}" for i in range(1, MASTERS + 1)] + [
        f"worker-{i}" for i in range(1, WORKERS + 1)
    ]


def lasting(seconds: float, what: str) -> None:
    """Let a fault last ``seconds`` (the time is the fault's, not a synchronisation)."""
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started >= seconds, seconds + 5, 0.1, what)


# -- the scenarios -------------------------------------------------------------------------


def _reader_host_cut(p: Partitions, seconds: float, cut: Callable[[Host], None]) -> None:
    """``cut`` a reader's worker's host, for ``seconds``, then heal it."""
    with healed_after(p.host(p.reader_worker())) as host:
        cut(host)
        lasting(seconds, f"{seconds} s of partition")


def worker_cut_from_postgres(p: Partitions) -> None:
    """A reader's worker loses PostgreSQL (it still reaches Redis), healed after 30 s."""
    _reader_host_cut(p, 30, lambda host: host.cut(p.engine_port, p.data_port))


def worker_cut_from_redis(p: Partitions) -> None:
    """A reader's worker loses Redis (it still reaches PostgreSQL) for 10 s: longer than the
    link checks take to end its connections."""
    _reader_host_cut(p, 10, lambda host: host.cut(p.redis_port))


def master_cut_from_postgres(p: Partitions) -> None:
    """The active master loses PostgreSQL (it still reaches Redis and the workers): the other
    master takes over; the deposed one must write nothing once healed."""
    _, host = p.active_master_host()
    epoch = p.c.lease()[0]
    with healed_after(host):
        host.cut(p.engine_port)
        wait_for(lambda: (a := p.c.active_master()) and a[0] > epoch, 30, 0.05, "the next master")
        lasting(3, "the partition to outlast the takeover")


def answers_dropped(p: Partitions) -> None:
    """Asymmetric: PostgreSQL's answers to a reader's worker are lost, its packets arrive."""
    _reader_host_cut(p, 10, lambda host: host.drop_answers(p.engine_port, p.data_port))


def slow_database_link(p: Partitions) -> None:
    """A reader's worker's database link: 200 ms ± 50 ms each way and 1% loss, for 60 s. No
    member is removed and checkpoints go on."""
    worker = p.reader_worker()
    host = p.host(worker)
    removals = p.removals()
    with healed_after(host):
        p.relay.slow(host.name, 0.2, 0.05)
        host.lose(1, p.engine_port, p.data_port)
        try:
            started = time.time()
            lasting(20, "the first 20 s of a slow link")
            assert p.committed_after(started), "no checkpoint committed over a slow link"
            holds_for(lambda: p.removals() == removals, 40, "no member removed")
            assert p.committed_after(started + 20), "checkpoints stopped over a slow link"
        finally:
            p.relay.heal(host.name)


def _commit_answer_lost(p: Partitions, process: str, port: int, prefix: str) -> None:
    host = p.host(process)
    fired = p.relay.cut_after(host.name, port, prefix)
    try:
        assert fired.wait(30), f"{process} sent no {prefix} in 30 s"
        lasting(6, "6 s without the answer")
    finally:
        host.heal()
        p.relay.heal(host.name)


def sink_commit_answer_lost(p: Partitions) -> None:
    """The streaming sink's COMMIT PREPARED reaches the database; its answer never comes (a
    reader's task group writes its own rows: the sink runs in it)."""
    _commit_answer_lost(p, p.reader_worker(), p.data_port, "COMMIT PREPARED")


def master_commit_answer_lost(p: Partitions) -> None:
    """The active master's next COMMIT reaches the database; its answer never comes."""
    name, _ = p.active_master_host()
    _commit_answer_lost(p, name, p.engine_port, "COMMIT")


def cleanup_record(p: Partitions, job_id: int) -> tuple | None:
    """(state, executions) of the job's running-state cleanup record."""
    return p.c.one(
        "SELECT state, executions FROM engine_jobcleanuprecord"
        " WHERE job_id = %s AND kind = 'JOB_STATE'",
        (job_id,),
    )


def partition_inside_cleanup_delay(p: Partitions) -> None:
    """The batch job ends; inside its cleanup delay the active master loses PostgreSQL past
    the record's due time. The record is still executed, once."""
    wait_for(lambda: job(p.c, p.batch_job)["jobStatus"] == "FINISHED", 120, 0.2, "the batch job")
    _, host = p.active_master_host()
    with healed_after(host):
        host.cut(p.engine_port)
        lasting(CLEANUP_DELAY + 4, "the partition to pass the cleanup's due time")
    wait_for(lambda: (cleanup_record(p, p.batch_job) or ("",))[0] == "DONE", 60, 0.2, "the cleanup")
    assert cleanup_record(p, p.batch_job) == ("DONE", 1), "the cleanup ran more than once"


def partition_during_drain(p: Partitions) -> None:
    """A reader's worker is drained, and loses PostgreSQL in the middle of it for 10 s."""
    worker = p.reader_worker()
    uuid = p.c.one("SELECT uuid FROM engine_member WHERE name = %s AND state = 'ALIVE'", (worker,))
    code, body = p.c.post(f"/api/v1/members/{uuid}/drain", {"reason": "partition test"})
    assert code in (200, 202), body
    with healed_after(p.host(worker)) as host:
        host.cut(p.engine_port, p.data_port)
        lasting(10, "10 s of partition")
    wait_for(
        lambda: (
            p.c.one("SELECT state FROM engine_member WHERE uuid = %s", (uuid,))
            in ("LEFT", "REMOVED")
        ),
        60,
        0.2,
        "the drained worker to leave",
    )


SCENARIOS: dict[str, Callable[[Partitions], None]] = {
    "worker cut off from PostgreSQL for 30 s": worker_cut_from_postgres,
    "worker cut off from Redis": worker_cut_from_redis,
    "active master cut off from PostgreSQL": master_cut_from_postgres,
    "PostgreSQL's answers to a worker dropped": answers_dropped,
    "slow database link (200±50 ms, 1% loss) 60 s": slow_database_link,
    "a sink's COMMIT answer lost": sink_commit_answer_lost,
    "a master's COMMIT answer lost": master_commit_answer_lost,
    "partition inside a cleanup delay": partition_inside_cleanup_delay,
    "partition during a drain": partition_during_drain,
}


def prepare_data_server(data: PrivatePostgres) -> None:
    """The jobs' server: a database for the streaming target, one for the batch tables, and
    the role the batch jobs connect as."""
    with psycopg.connect(f"{data.url}/postgres", autocommit=True) as conn:
        for name in ("keel_stream", "keel_data"):
            conn.execute(f"CREATE DATABASE {name}")
        conn.execute("CREATE ROLE root LOGIN SUPERUSER")


def streaming(
    cluster: Cluster, template: DatabaseTemplate, data: PrivatePostgres, make: Callable[[], T]
) -> Iterator[T]:
    """The cluster up, its chaos kit made (``make``) with the streaming job running; the
    cluster's databases dropped on the way out."""
    try:
        with cluster:
            chaos = make()
            chaos.jdbc = f"jdbc:postgresql://{data.address}:{data.port}/keel_data"
            chaos.start_streaming()
            yield chaos
    finally:
        with contextlib.suppress(Exception):
            template.drop_all()


def data_urls(data: PrivatePostgres) -> dict[str, str]:
    return {"data_url": f"{data.url}/keel_data", "stream_url": f"{data.url}/keel_stream"}


@contextlib.contextmanager
def partition_cluster() -> Iterator[Partitions]:
    """The cluster on test hosts, its services private on the network's service address."""
    with Network(MASTERS + WORKERS) as net:
        with (
            PrivatePostgres(address=net.service) as postgres,
            PrivateRedis(address=net.service) as redis,
            PrivatePostgres({"max_prepared_transactions": 16}, address=net.service) as data,
        ):
            prepare_data_server(data)
            net.relay_through([postgres.port, data.port])
            template = DatabaseTemplate(postgres.url)
            hosts = [
                arg
                for name, host in zip(process_names(), net.hosts, strict=True)
                for arg in ("--host", f"{name}={host.name}")
            ]
            cluster = Cluster(
                template,
                masters=MASTERS,
                workers=WORKERS,
                slots=4,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                redis_url=redis.url,
                extra_args=tuple(hosts),
            )
            cluster.env["KEEL_JOB_STATE_CLEANUP_DELAY"] = f"{CLEANUP_DELAY}s"
            cluster.env["KEEL_CONNECTORS_JDBC_ALLOWED"] = f"{net.service}:{data.port}"
            ports, urls = (postgres.port, redis.port, data.port), data_urls(data)
            yield from streaming(
                cluster,
                template,
                data,
                lambda: Partitions(cluster, net, *ports, postgres=postgres, redis=redis, **urls),
            )
