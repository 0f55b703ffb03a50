"""Row schemas: rows travel as tuples in field order; a schema names and types the fields."""

from __future__ import annotations

from dataclasses import dataclass

FIELD_TYPES = ("int", "bigint", "string", "double", "float", "boolean", "decimal", "timestamp")


@dataclass(frozen=True)
class Schema:
    fields: tuple[tuple[str, str], ...]  # (name, type)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.fields]

    def index(self, name: str) -> int:
        return self.names.index(name)

    def to_json(self) -> list[list[str]]:
        return [list(f) for f in self.fields]

    @classmethod
    def from_json(cls, data: list) -> Schema:
        return cls(tuple((str(n), str(t)) for n, t in data))


def parse_schema(tree: dict | None) -> tuple[Schema | None, list[tuple[str, str]]]:
    """``schema { fields { id = bigint, name = string } }`` -> Schema, [(option, message)]."""
    if not tree:
        return None, []
    fields = tree.get("fields")
    if not isinstance(fields, dict) or not fields:
        return None, [("schema.fields", "must be an object of field = type")]
    errors = []
    out = []
    for name, kind in fields.items():
        if not isinstance(kind, str) or kind.lower() not in FIELD_TYPES:
            errors.append(
                (
                    f"schema.fields.{name}",
                    f"unknown type {kind!r} (known: {', '.join(FIELD_TYPES)})",
                )
            )
            continue
        out.append((name, kind.lower()))
    return (Schema(tuple(out)) if not errors else None), errors
