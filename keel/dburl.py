"""``DATABASE_URL`` to Django's database settings, libpq's multi-host form included.

dj-database-url reads one host. A URL naming several (``postgres://u@h1:5432,h2:5432/keel?
target_session_attrs=read-write``, libpq's own form) is read by libpq's parser instead: Django
hands ``HOST`` and ``PORT`` to libpq as they are, comma-separated lists and all, and libpq then
connects to the first host that is a primary, so a promoted standby is found on the next
connection. Query parameters of either form (``sslmode``, ``target_session_attrs``) become
connection options.
"""

from __future__ import annotations

import dj_database_url
from psycopg.conninfo import conninfo_to_dict

from engine.services import names_several_hosts

#: libpq's keys that are Django settings of their own, not connection options.
_SETTINGS = {
    "dbname": "NAME",
    "user": "USER",
    "password": "PASSWORD",
    "host": "HOST",
    "port": "PORT",
}


def database_settings(url: str) -> dict:
    """The ``DATABASES["default"]`` entry for ``url`` (connections closed after each request
    or task: ``CONN_MAX_AGE`` 0)."""
    if not names_several_hosts(url):
        db = dj_database_url.parse(url, conn_max_age=0)
        db.setdefault("OPTIONS", {})
        return db
    params = {k: str(v) for k, v in conninfo_to_dict(url).items()}
    db = {setting: params.pop(key, "") for key, setting in _SETTINGS.items()}
    db.update(ENGINE="django.db.backends.postgresql", CONN_MAX_AGE=0, OPTIONS=params)
    return db
