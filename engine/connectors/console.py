"""Console (prints a bounded number of rows) and Blackhole (counts only) sinks; at-least-once."""

from __future__ import annotations

import logging

from engine.connectors.base import Option, SinkPlugin, SinkWriter
from engine.connectors.registry import register

log = logging.getLogger("keel.sink.console")


class ConsoleWriter(SinkWriter):
    def __init__(self, schema, limit: int, prefix: str) -> None:
        self.names = schema.names
        self.limit = limit
        self.prefix = prefix
        self.printed = 0

    def write(self, rows: list[tuple]) -> None:
        for row in rows:
            if self.printed >= self.limit:
                return
            log.info("%s %s", self.prefix, dict(zip(self.names, row, strict=False)))
            self.printed += 1


@register
class Console(SinkPlugin):
    name = "Console"
    options = (Option("limit", int, default=100, min=0, help="print at most this many rows"),)

    def writer(self, schema, context: dict) -> SinkWriter:
        return ConsoleWriter(schema, self.config["limit"], context.get("label", "row"))


class BlackholeWriter(SinkWriter):
    def __init__(self) -> None:
        self.count = 0

    def write(self, rows: list[tuple]) -> None:
        self.count += len(rows)


@register
class Blackhole(SinkPlugin):
    name = "Blackhole"

    def writer(self, schema, context: dict) -> SinkWriter:
        return BlackholeWriter()
