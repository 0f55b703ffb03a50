"""Connector boundaries the admin sets, not the job: LocalFile stays inside the file roots
(symlinks and ``..`` resolved), Jdbc reaches only allowed databases, never the engine's own,
and only with credentials the config (or a named connection) gives. Refusals are 400s naming
the option, and a refused host is never connected to."""

from __future__ import annotations

import os
import socket
import threading

import psycopg
import pytest
from django.db import connection

from engine.models import Connection, Job
from tests.clusterkit import SERVER_URL

JSON_SCHEMA = "schema { fields { id = bigint } }"


def submit(api, config):
    return api.post("/api/v1/jobs", {"config": config}, format="json")


def refused(response, path: str) -> str:
    assert response.status_code == 400, response.content[:300]
    errors = response.json()["errors"]
    messages = [e["message"] for e in errors if e["path"] == path]
    assert messages, errors
    return messages[0]


@pytest.fixture
def roots(settings, tmp_path):
    """One file root (tmp_path/root) and, beside it, a directory outside every root."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.json").write_text('{"id": 1}\n')
    settings.ENGINE = {**settings.ENGINE, "connectors.file-roots": [str(root)]}
    return root, outside


def localfile_source(path) -> str:
    return (
        f'source {{ LocalFile {{ path = "{path}", file_format_type = json, {JSON_SCHEMA} }} }}\n'
        "sink { Console { } }\n"
    )


def localfile_sink(path) -> str:
    return (
        "source { FakeSource { } }\n"
        f'sink {{ LocalFile {{ path = "{path}", file_format_type = json }} }}\n'
    )


def test_localfile_outside_the_roots_is_refused(api, roots):
    root, outside = roots
    for config, path in (
        (localfile_source(outside / "secret.json"), "source[0].LocalFile.path"),
        (localfile_source("/etc"), "source[0].LocalFile.path"),
        (localfile_source(f"{root}/../outside"), "source[0].LocalFile.path"),
        (localfile_sink("/etc/keeltest"), "sink[0].LocalFile.path"),
        (localfile_sink(".var"), "sink[0].LocalFile.path"),
    ):
        assert "engine.connectors.file-roots" in refused(submit(api, config), path)
    assert not Job.objects.exists()
    (root / "in.json").write_text('{"id": 1}\n')
    assert submit(api, localfile_source(root / "in.json")).status_code == 201
    assert submit(api, localfile_sink(root / "out")).status_code == 201


def test_a_symlink_inside_a_root_to_outside_is_refused(api, roots):
    root, outside = roots
    (root / "link").symlink_to(outside)
    (root / "file-link.json").symlink_to(outside / "secret.json")
    for config, path in (
        (localfile_source(root / "link"), "source[0].LocalFile.path"),
        (localfile_source(root / "file-link.json"), "source[0].LocalFile.path"),
        (localfile_sink(root / "link" / "parts"), "sink[0].LocalFile.path"),
    ):
        message = refused(submit(api, config), path)
        assert str(outside) in message  # what it resolves to
    assert not Job.objects.exists()


def jdbc_source(url: str, credentials: str = 'user = "u", password = "p"') -> str:
    return (
        f'source {{ Jdbc {{ url = "{url}", {credentials}, table = t }} }}\n'
        "sink { Console { } }\n"
    )


def engine_url() -> str:
    db = connection.settings_dict
    return f"jdbc:postgresql://{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def test_jdbc_on_the_engine_database_is_refused_however_it_is_named(api, settings):
    settings.ENGINE = {**settings.ENGINE, "connectors.jdbc-allowed": ["*"]}
    db = connection.settings_dict
    port = db["PORT"] or 5432
    for url in (
        engine_url(),
        f"jdbc:postgresql://localhost:{port}/{db['NAME']}",
        f"jdbc:postgresql://[::1]:{port}/{db['NAME']}",
        f"postgresql://127.0.0.1:{port}/{db['NAME']}?sslmode=disable",
    ):
        message = refused(submit(api, jdbc_source(url)), "source[0].Jdbc.url")
        assert "engine's own database" in message, url
    # Even through a named connection an admin made.
    stored = Connection(name="engine", url=engine_url(), user="root")
    stored.set_password("x")
    stored.save()
    message = refused(
        submit(api, jdbc_source("", 'connection = "engine"').replace('url = "", ', "")),
        "source[0].Jdbc.connection",
    )
    assert "engine's own database" in message


def test_jdbc_without_credentials_never_falls_back_to_the_process(api, monkeypatch, tmp_path):
    monkeypatch.setenv("PGUSER", "root")
    monkeypatch.setenv("PGPASSWORD", "from-the-environment")
    url = "jdbc:postgresql://127.0.0.1:5432/postgres"
    for credentials in ('user = "root"', 'password = "p"', 'user = "", password = ""'):
        message = refused(submit(api, jdbc_source(url, credentials)), "source[0].Jdbc.url")
        assert "user and password are required" in message
    for bad in (
        "jdbc:postgresql://root:pw@127.0.0.1:5432/postgres",
        "jdbc:postgresql://127.0.0.1:5432/postgres?passfile=/root/.pgpass",
        "jdbc:postgresql://127.0.0.1:5432/postgres?service=prod",
        "jdbc:postgresql:///postgres",
    ):
        assert refused(submit(api, jdbc_source(bad)), "source[0].Jdbc.url")
    assert not Job.objects.exists()


@pytest.fixture
def listener():
    """A TCP port that counts the connections made to it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


def test_a_host_outside_the_allow_list_is_never_contacted(api, settings, listener):
    port, accepted = listener
    settings.ENGINE = {**settings.ENGINE, "connectors.jdbc-allowed": ["db.internal:5432"]}
    message = refused(
        submit(api, jdbc_source(f"jdbc:postgresql://127.0.0.1:{port}/warehouse")),
        "source[0].Jdbc.url",
    )
    assert "engine.connectors.jdbc-allowed" in message
    assert "cannot connect" not in message
    assert accepted == []


def test_a_named_connection_supplies_credentials_and_never_shows_its_password(api, admin_client):
    stored = Connection(
        name="warehouse", url="jdbc:postgresql://127.0.0.1:5432/postgres", user="root"
    )
    stored.set_password("s3cret-pass")
    stored.save()
    raw = Connection.objects.filter(name="warehouse").values_list("password_encrypted", flat=True)
    assert "s3cret-pass" not in raw[0]  # encrypted at rest
    assert Connection.objects.get(name="warehouse").password() == "s3cret-pass"
    # Planning resolves it (the table is missing: the message comes from a real session).
    message = refused(
        submit(api, jdbc_source("", 'connection = "warehouse"').replace('url = "", ', "")),
        "source[0].Jdbc.table",
    )
    assert "no table" in message
    # The job cannot loosen what the admin set: no driver parameters beside a named connection.
    for props in ("sslmode = disable", 'options = "-c search_path=evil"'):
        block = f'connection = "warehouse", properties {{ {props} }}'
        message = refused(
            submit(api, jdbc_source("", block).replace('url = "", ', "")),
            "source[0].Jdbc.properties",
        )
        assert "named connection" in message
    page = admin_client.get(f"/admin/engine/connection/{stored.id}/change/")
    assert page.status_code == 200 and b"s3cret-pass" not in page.content


@pytest.fixture
def data_db():
    from tests.clusterkit import admin_conn

    name = f"keel_boundaries_{os.getpid()}"
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(f"{SERVER_URL}/{name}", autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY)")
    yield f"jdbc:postgresql://127.0.0.1:5432/{name}"
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_literal_password_is_redacted_in_every_answer(api, data_db):
    config = jdbc_source(data_db, 'user = "root", password = "pw-literal-123"')
    config += '# password = "in-a-comment"\n'
    response = submit(api, config)
    assert response.status_code == 201, response.content
    detail = api.get(f"/api/v1/jobs/{response.json()['jobId']}").content.decode()
    assert "pw-literal-123" not in detail and "in-a-comment" not in detail
    assert "******" in detail
    listing = api.get("/api/v1/jobs").content.decode()
    assert "pw-literal-123" not in listing
