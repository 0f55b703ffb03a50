"""A primary lost, a synchronous standby promoted: the chaos cluster (tests.chaoskit) on an
engine database with a synchronous standby, reached through libpq's multi-host
``DATABASE_URL`` with ``target_session_attrs=read-write``.

The fault crashes the primary (an immediate stop: no checkpoint, no goodbye) and promotes the
standby. Every commit the engine was told of was on the standby first (synchronous
replication), so nothing it saw committed is lost; its sessions find the new primary on their
next connection, within ``engine.database-outage-tolerance``, with no restore.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

import psycopg

from engine.cluster.incarnation import SERVER_SINCE
from tests.chaoskit import Chaos
from tests.clusterkit import Cluster, DatabaseTemplate, wait_for
from tests.faultkit import PrivatePostgres, PrivateRedis
from tests.partitionkit import data_urls, lasting, prepare_data_server, streaming

HEARTBEAT_TIMEOUT = 3.0
#: The primary waits for its standby's flush before a commit returns.
SYNCHRONOUS = {"synchronous_standby_names": "'*'", "synchronous_commit": "on"}


class Failover(Chaos):
    def __init__(
        self, cluster: Cluster, primary: PrivatePostgres, standby: PrivatePostgres, **kw
    ) -> None:
        super().__init__(cluster, **kw)
        self.primary, self.standby = primary, standby
        self.seen: dict[str, int] = {}

    def committed_so_far(self) -> dict[str, int]:
        """The newest rows of the engine's own that this test saw committed."""
        return {
            "event": self.c.one("SELECT max(seq) FROM engine_engineevent"),
            "checkpoint": self.c.one(
                "SELECT max(id) FROM engine_checkpoint WHERE state = 'COMPLETED'"
            ),
            "ack": self.c.one("SELECT max(id) FROM engine_taskcheckpoint"),
        }


def lose_the_primary(f: Failover) -> None:
    """Crash the primary; promote the standby. Then every row seen committed is still there."""
    f.seen = f.committed_so_far()
    crashed = f.c.one("SELECT now()")
    f.c.db.close()
    f.primary.crash()
    # A promotion slower than the members' heartbeat timeout (an operator's, or a failover
    # manager's after its own timeout): the members must not be judged by the time it took.
    lasting(2 * HEARTBEAT_TIMEOUT, "a slow promotion")
    f.standby.promote()
    wait_for(lambda: primary_answers(f.c.database_url), 20, 0.1, "the promoted standby")
    # The master gives members one heartbeat timeout from here to take their locks back on
    # the new primary (which has none of the old one's): not from the standby's own start.
    since = f.c.one(f"SELECT {SERVER_SINCE}")
    assert since >= crashed - timedelta(seconds=1), f"server serves since {since}, not {crashed}"
    after = f.committed_so_far()
    lost = {k: (v, after[k]) for k, v in f.seen.items() if v and (after[k] or 0) < v}
    assert not lost, f"committed rows lost in the failover (seen, now): {lost}"


def primary_answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            return not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
    except psycopg.OperationalError:
        return False


def streams_synchronously(primary: PrivatePostgres) -> bool:
    with psycopg.connect(f"{primary.url}/postgres", autocommit=True) as conn:
        sql = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
        return bool(conn.execute(sql).fetchone()[0])


@contextlib.contextmanager
def failover_cluster() -> Iterator[Failover]:
    """The cluster on a primary with a synchronous standby (both private), a private Redis
    and a private server for the jobs' tables."""
    with (
        PrivatePostgres(SYNCHRONOUS) as primary,
        PrivatePostgres(replica_of=primary) as standby,
        PrivateRedis() as redis,
        PrivatePostgres({"max_prepared_transactions": 16}) as data,
    ):
        wait_for(lambda: streams_synchronously(primary), 30, 0.1, "a synchronous standby")
        prepare_data_server(data)
        both = f"postgres://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        template = DatabaseTemplate(both)
        cluster = Cluster(
            template,
            masters=2,
            workers=2,
            slots=4,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            redis_url=redis.url,
        )
        cluster.database_url += "?target_session_attrs=read-write"
        cluster.env["DATABASE_URL"] = cluster.database_url
        yield from streaming(
            cluster,
            template,
            data,
            lambda: Failover(
                cluster, primary, standby, postgres=primary, redis=redis, **data_urls(data)
            ),
        )
