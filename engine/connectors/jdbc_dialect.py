"""What a Jdbc dialect is: the operations of one database the Jdbc source and sink need, and
which database a block names (engine.connectors.dialects picks the Dialect). engine.connectors
.jdbc holds what every database shares (options, checks of the config, the plugin classes) and
asks the dialect for the rest; a new database is a new Dialect (engine.connectors.pg_dialect,
engine.connectors.mysql.dialect), never a change of jdbc.py."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from engine.connectors.base import SchemaNotFollowed, SinkWriter
from engine.connectors.boundaries import Refused
from engine.connectors.jdbc_options import DRIVERS, FAMILIES
from engine.connectors.schema import Schema

#: The drivers of the MySQL family, as SeaTunnel's configs name them.
MYSQL_DRIVERS = frozenset(d for d, db in DRIVERS.items() if FAMILIES.get(db) == "MySQL")
#: Why a named connection takes no ``properties``: they would override what the admin set.
NAMED_PROPERTIES = (
    "a named connection's driver parameters are the admin's: properties (TLS, options, "
    "local infile, ...) cannot change them; ask an admin, or give your own url"
)


class Dialect:
    """One database's side of the Jdbc source and sink. Each method gets the block's typed
    config (after the shared checks: a table or a query, the connection options)."""

    #: The database's name, as messages and docs say it.
    name = ""
    #: The errors a failed statement raises (a check reports them on the option at fault).
    errors: tuple[type[BaseException], ...] = ()

    def notes(self, config: dict) -> list[tuple[str, str]]:
        """Warnings about the URL: parameters that have no effect here."""
        return []

    def connection_errors(
        self, config: dict, table_required: bool, missing_ok: bool
    ) -> list[tuple[str, str]]:
        """The database (reachable, allowed), the table's name in it (``table_path``,
        ``schema``, normalised into ``table``) and the table itself (missing when
        ``missing_ok``: a sink's save mode decides)."""
        raise NotImplementedError

    def placeholder_names(self, config: dict) -> dict[str, str]:
        """``${database_name}`` and the like, for a table source."""
        return {}

    def source_errors(self, config: dict) -> list[tuple[str, str]]:
        """A source's checks against its database: its columns' types, its partition column."""
        raise NotImplementedError

    def output_schema(self, config: dict) -> Schema:
        raise NotImplementedError

    def create_splits(self, config: dict) -> list[dict]:
        raise NotImplementedError

    def read(
        self, config: dict, split: dict, offset: int, batch_size: int
    ) -> Iterator[tuple[pa.RecordBatch, int]]:
        """``(batch, next_offset)`` of the split's rows from ``offset`` in a total order."""
        raise NotImplementedError

    def table_columns(self, config: dict) -> set[str]:
        """The sink table's columns (none when it does not exist yet)."""
        raise NotImplementedError

    def sink_errors(self, config: dict) -> list[tuple[str, str]]:
        """What this database's sink cannot do with the block's options."""
        return []

    def apply_save_modes(self, config: dict, schema: Schema | None) -> list[str]:
        raise NotImplementedError

    def add_columns(self, config: dict, added: list[tuple[str, str]]) -> None:
        """The target table takes columns ``added`` (a source's schema change)."""
        raise SchemaNotFollowed(f"a {self.name} table cannot follow a schema change here")

    def writer(self, config: dict, schema: Schema, context: dict) -> SinkWriter:
        raise NotImplementedError


def is_mysql_url(url: str) -> bool:
    """Whether a JDBC URL names MySQL or MariaDB (Connector/J's or the MariaDB driver's)."""
    return (url or "").strip().lower().startswith(("jdbc:mysql:", "jdbc:mariadb:"))


def _stored(name: str):
    from engine.models import Connection

    return Connection.objects.filter(name=name).first()


def named_connection(config: dict):
    """The admin's stored Connection the block names (None when it names none); Refused when
    there is no such connection, or when the block also gives ``properties`` (driver
    parameters after the connection's URL would turn off its TLS or change its options)."""
    name = config.get("connection")
    if not name:
        return None
    stored = _stored(name)
    if stored is None:
        raise Refused(f"no connection named {name!r} (an admin creates them)")
    if config.get("properties"):
        raise Refused(NAMED_PROPERTIES)
    return stored


def block_url(config: dict) -> str:
    """The block's URL, or its named connection's ("" when neither is known: the checks
    say what is missing)."""
    if config.get("url"):
        return config["url"]
    stored = _stored(config["connection"]) if config.get("connection") else None
    return stored.url if stored else ""


def family(config: dict) -> str:
    """``mysql`` or ``postgresql``: the block's database, by its URL (or its named
    connection's), else by its driver. Other databases are refused before (jdbc_options
    .database_refusal)."""
    url = block_url(config)
    mysql = is_mysql_url(url) if url else config.get("driver") in MYSQL_DRIVERS
    return "mysql" if mysql else "postgresql"
