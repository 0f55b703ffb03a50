"""Model fields of the engine's own."""

from __future__ import annotations

import json

from django.db import models


class OrderedJSONField(models.TextField):
    """JSON kept as text, so object key order survives (jsonb sorts keys).

    Plans depend on order: ``field_mapper { id = a, name = b }`` maps fields in that order and
    ``schema { fields { ... } }`` declares columns in that order.
    """

    def from_db_value(self, value, expression, connection):
        return None if value is None else json.loads(value)

    def to_python(self, value):
        return json.loads(value) if isinstance(value, str) else value

    def get_prep_value(self, value):
        return None if value is None else json.dumps(value)
