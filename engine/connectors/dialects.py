"""The Jdbc connector's databases: the Dialect of a block (engine.connectors.jdbc_dialect says
what one is), chosen by its URL (or its named connection's URL), else its driver, and the
checks of the connection every dialect shares."""

from __future__ import annotations

from engine.connectors.jdbc_dialect import NAMED_PROPERTIES, Dialect, family
from engine.connectors.jdbc_options import database_refusal
from engine.connectors.mysql.dialect import MySqlDialect
from engine.connectors.pg_dialect import PostgresDialect

#: One of each: a dialect keeps no state of a block.
DIALECTS: dict[str, Dialect] = {"postgresql": PostgresDialect(), "mysql": MySqlDialect()}


def dialect_for(config: dict) -> Dialect:
    """The block's database (PostgreSQL by default)."""
    return DIALECTS[family(config)]


def check_connection(
    config: dict, table_required: bool = True, missing_ok: bool = False
) -> list[tuple[str, str]]:
    """The database the block names (PostgreSQL or MySQL, reachable, allowed) and its table
    (which may be missing when ``missing_ok``: a sink's save mode decides)."""
    refusal = database_refusal(config)
    if refusal:
        return [refusal]
    if config.get("connection") and (config.get("url") or config.get("password")):
        return [("connection", "give either a named connection or url/user/password, not both")]
    if config.get("connection") and config.get("properties"):
        return [("properties", NAMED_PROPERTIES)]
    return dialect_for(config).connection_errors(config, table_required, missing_ok)
