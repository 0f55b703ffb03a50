"""Console (prints a bounded number of rows) and Blackhole (counts only) sinks; at-least-once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from engine.connectors.base import Option, SinkPlugin, SinkWriter
from engine.connectors.batches import to_rows
from engine.connectors.registry import register

log = logging.getLogger("keel.sink.console")


class ConsoleWriter(SinkWriter):
    """Prints up to ``limit`` rows, ``delay`` seconds apart (SeaTunnel's ``log.print.delay.ms``,
    which slows the reader on purpose: it is how demos are paced)."""

    def __init__(
        self,
        schema,
        limit: int,
        prefix: str,
        delay: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.names = schema.names
        self.limit = limit
        self.prefix = prefix
        self.delay = delay
        self.sleep = sleep
        self.printed = 0

    def write(self, batch) -> None:
        """Only the rows still to print are made Python values: a batch past the limit costs
        nothing."""
        if self.printed >= self.limit or batch.num_rows == 0:
            return
        self.write_rows(to_rows(batch.slice(0, self.limit - self.printed)))

    def write_rows(self, rows: list[tuple]) -> None:
        for row in rows:
            if self.printed >= self.limit:
                return
            if self.delay and self.printed:
                self.sleep(self.delay)
            log.info("%s %s", self.prefix, dict(zip(self.names, row, strict=False)))
            self.printed += 1


@register
class Console(SinkPlugin):
    name = "Console"
    options = (
        Option("limit", int, default=100, min=0, help="print at most this many rows"),
        Option("log.print.data", bool, default=True, help="false: print nothing, only count"),
        Option("log.print.delay.ms", int, default=0, min=0, help="pause between printed rows"),
    )
    ignored_options = {
        "multi_table_sink_replica": "a sink writes one table; each table of a multi-table "
        "source has its own pipeline and sink"
    }

    def writer(self, schema, context: dict) -> SinkWriter:
        limit = self.config["limit"] if self.config["log.print.data"] else 0
        delay = self.config["log.print.delay.ms"] / 1000
        return ConsoleWriter(schema, limit, context.get("label", "row"), delay)

    def follow_schema(self, added: list[tuple[str, str]]) -> None:
        return None  # its rows are printed with whatever fields they have


class BlackholeWriter(SinkWriter):
    def __init__(self) -> None:
        self.count = 0

    def write(self, batch) -> None:
        self.count += batch.num_rows


@register
class Blackhole(SinkPlugin):
    name = "Blackhole"

    def writer(self, schema, context: dict) -> SinkWriter:
        return BlackholeWriter()

    def follow_schema(self, added: list[tuple[str, str]]) -> None:
        return None
