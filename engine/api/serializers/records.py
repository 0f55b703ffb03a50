"""Flat response records declared as a table of fields.

Much of the API answers with flat records of counts and references. Declared as a table (key to
field, in the order of the keys), each shape reads in one place, and a run of integer keys is
one ``integers(...)`` rather than a line per key.
"""

from __future__ import annotations

from rest_framework import serializers


def record(
    module: str, name: str, doc: str, fields: dict[str, serializers.Field]
) -> type[serializers.Serializer]:
    """A serializer class named ``name`` (its OpenAPI component) with ``fields`` in order."""
    return type(name, (serializers.Serializer,), {"__module__": module, "__doc__": doc, **fields})


def integers(*keys: str) -> dict[str, serializers.IntegerField]:
    return {key: serializers.IntegerField() for key in keys}
