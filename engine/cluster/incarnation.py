"""Since when the engine's PostgreSQL server has served it: what a database restart, or a
failover to a standby, resets. Free of Django, so that tests and benchmarks read the same SQL."""

from __future__ import annotations

#: The server's start, or, on a promoted standby, the last transaction it replayed (the lost
#: primary's last commit, moments before the promotion): a standby's own start may be days
#: old, and it holds none of the old primary's advisory locks.
SERVER_SINCE = "greatest(pg_postmaster_start_time(), pg_last_xact_replay_timestamp())"
