"""The Jdbc sink's writers: at-least-once (no checkpoints) and exactly-once (checkpointed),
and the sink sessions they write on."""

from __future__ import annotations

import hashlib
import json
import re
import uuid as uuidlib

import psycopg
from psycopg import sql

from engine.connectors.base import SinkWriter
from engine.connectors.pg import connect, split_table, table_ident
from engine.connectors.schema import Schema, jsonable, kind_args

#: A sink session never waits long or hangs: a lock held by a stuck session, a statement, or a
#: transaction its (frozen) worker left open each end within these.
SINK_SESSION_OPTIONS = (
    "-c lock_timeout=10000 -c statement_timeout=300000 -c idle_in_transaction_session_timeout=10000"
)


#: PostgreSQL keeps 63 bytes of an application_name: a sink session's name is built to fit
#: (a truncated name would hide the session from the fences that look for it).
APPLICATION_NAME_MAX = 63
WRITER_TAG_MAX = 12


def writer_tag(writer: str) -> str:
    """The writer key as it appears in a session name: itself when short, else a digest."""
    if len(writer) <= WRITER_TAG_MAX:
        return writer
    return hashlib.blake2b(writer.encode(), digest_size=WRITER_TAG_MAX // 2).hexdigest()


def member_sink_sessions(member_uuid: str | uuidlib.UUID) -> str:
    """A LIKE pattern for every sink session of one member (ended when it is removed)."""
    return f"keel-sink:{uuidlib.UUID(str(member_uuid)).hex}:%"


def sink_application_name(member_uuid: str, writer: str, attempt: int) -> str:
    """Names a sink session after its member, writer and attempt: the master ends a removed
    member's sink sessions, and a writer's next attempt ends those of the older ones."""
    member = uuidlib.UUID(member_uuid).hex if member_uuid else "-"
    name = f"keel-sink:{member}:{writer_tag(writer)}:{attempt}"
    if len(name) > APPLICATION_NAME_MAX:
        raise ValueError(f"sink session name too long: {name}")
    return name


def connect_sink(config: dict, context: dict, writer: str) -> psycopg.Connection:
    return connect(
        config,
        application_name=sink_application_name(
            context.get("memberUuid", ""), writer, context.get("attempt", 0)
        ),
        options=SINK_SESSION_OPTIONS,
        autocommit=False,
    )


def writer_key(context: dict) -> str:
    """The same for every attempt of one reader's sink: job, pipeline, reader, and the sink's
    index when it is not the first (a pipeline may have several Jdbc sinks). The job is its
    uuid: job ids restart in every engine database, and two clusters (or a cluster whose
    database was made anew) writing to one target must not adopt or end each other's writers.
    A job from before uuids keeps its id, and so the key its staged rows already carry."""
    job = context.get("jobUuid") or context.get("jobId")
    key = f"{job}-{context.get('pipelineId')}-{context.get('readerIndex')}"
    label = str(context.get("label", ""))
    if label.startswith("sink[") and not label.startswith("sink[0]"):
        key += f"-{label[5 : label.index(']')]}"
    return key


def fence_older_attempts(conn: psycopg.Connection, writer: str, attempt: int) -> None:
    """End the sessions of this writer's older attempts (a zombie frozen mid-COPY, or woken
    after its member was removed), waiting until they are gone, then hold the writer's lock
    for this attempt's life: nothing an older attempt sent can land after this returns."""
    conn.execute(
        """
        SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
         WHERE application_name LIKE 'keel-sink:%%' AND pid <> pg_backend_pid()
           AND datname = current_database()
           AND split_part(application_name, ':', 3) = %s
           AND split_part(application_name, ':', 4) ~ '^[0-9]+$'
           AND split_part(application_name, ':', 4)::int < %s
        """,
        (writer_tag(writer), attempt),
    )
    conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"keel-writer:{writer}",))
    conn.commit()


def _insert_from(
    table: sql.Composable,
    cols: sql.Composable,
    source: sql.Composable,
    where: sql.Composable,
    order: sql.Composable,
    columns: list[str],
    keys: list[str],
) -> sql.Composed:
    """INSERT INTO table SELECT ... FROM source: an upsert on ``keys`` (the last row of a key
    wins), or a plain insert without keys."""
    if not keys:
        return sql.SQL("INSERT INTO {t} ({cols}) SELECT {cols} FROM {s} WHERE {w}").format(
            t=table, cols=cols, s=source, w=where
        )
    key_list = sql.SQL(", ").join(sql.Identifier(k) for k in keys)
    query = sql.SQL(
        "INSERT INTO {t} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {s} WHERE {w} "
        "ORDER BY {keys}, {o} DESC ON CONFLICT ({keys}) "
    ).format(t=table, cols=cols, keys=key_list, s=source, w=where, o=order)
    updates = [c for c in columns if c not in keys]
    if not updates:
        return query + sql.SQL("DO NOTHING")
    return (
        query
        + sql.SQL("DO UPDATE SET ")
        + sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in updates
        )
    )


#: ``field_ide``: how incoming field names become the table's column names.
FIELD_IDE = {"ORIGINAL": str, "UPPERCASE": str.upper, "LOWERCASE": str.lower}
#: A custom sink ``query`` is one statement that changes rows.
QUERY_STATEMENT = re.compile(r"^\s*(insert|update|delete|merge)\b", re.IGNORECASE)
_QUOTED_OR_MARK = re.compile(r"'(?:[^']|'')*'|\?|%")
#: A custom query's staging columns, by field type (complex values are staged as JSON text).
STAGE_TYPES = {
    "tinyint": "smallint",
    "smallint": "smallint",
    "int": "integer",
    "bigint": "bigint",
    "float": "real",
    "double": "double precision",
    "decimal": "numeric",
    "boolean": "boolean",
    "bytes": "bytea",
    "date": "date",
    "time": "time",
    "timestamp": "timestamptz",
}


def target_columns(config: dict, schema: Schema) -> list[str]:
    return [FIELD_IDE[config.get("field_ide") or "ORIGINAL"](n) for n in schema.names]


def upsert_keys(config: dict) -> list[str]:
    return (config.get("primary_keys") or []) if config.get("enable_upsert", True) else []


def placeholders(query: str) -> int:
    """The ``?`` of a custom query, outside its string literals."""
    return sum(1 for m in _QUOTED_OR_MARK.finditer(query) if m.group() == "?")


def custom_statement(query: str) -> str:
    """SeaTunnel's JDBC placeholders (``?``) as psycopg's; literal ``%`` kept."""
    marks = {"?": "%s", "%": "%%"}
    return _QUOTED_OR_MARK.sub(lambda m: marks.get(m.group(), m.group()), query.strip().rstrip(";"))


def staged(schema: Schema):
    """A function that makes a row fit the staging table (complex values as JSON)."""
    complex_at = [
        (i, kind) for i, kind in enumerate(schema.kinds) if kind_args(kind)[0] not in STAGE_TYPES
    ]
    if not complex_at:
        return lambda row: row

    def fit(row: tuple) -> tuple:
        out = list(row)
        for i, kind in complex_at:
            if out[i] is not None and kind != "string":
                out[i] = json.dumps(jsonable(kind, out[i]))
        return tuple(out)

    return fit


class JdbcWriter(SinkWriter):
    """At-least-once writer (no checkpoints): each batch is COPYed into a temporary table and
    upserted (or inserted) at once."""

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        self.conn = connect_sink(config, context, writer_key(context))
        self.custom = custom_statement(config["query"]) if config.get("query") else None
        if self.custom:
            self.fit = staged(schema)
            return
        self.columns = target_columns(config, schema)
        table = table_ident(config["table"])
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)
        self.conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE keel_stage ON COMMIT DELETE ROWS AS "
                "SELECT {cols} FROM {t} WITH NO DATA"
            ).format(cols=cols, t=table)
        )
        self.conn.commit()
        self.upsert = _insert_from(
            table,
            cols,
            sql.Identifier("keel_stage"),
            sql.SQL("true"),
            sql.SQL("ctid"),
            self.columns,
            upsert_keys(config),
        )
        self.copy = sql.SQL("COPY keel_stage ({cols}) FROM STDIN").format(cols=cols)

    def write(self, rows: list[tuple]) -> None:
        if self.custom:
            with self.conn.cursor() as cur:
                cur.executemany(self.custom, [self.fit(r) for r in rows])
            self.conn.commit()
            return
        with self.conn.cursor() as cur:
            with cur.copy(self.copy) as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(self.upsert)
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()

    def abort(self) -> None:
        self.conn.close()


class ExactlyOnceJdbcWriter(SinkWriter):
    """Exactly-once writer for checkpointed jobs.

    Rows go to a durable staging table ``<table>__keel_stage`` tagged with this writer's stable
    key (job, pipeline, reader: the same for every attempt). At barrier N the untagged rows are
    tagged N (pre-commit); when N completes they move to the target in one transaction and leave
    the stage, so committing N twice changes nothing. A new attempt first fences the older ones
    (``fence_older_attempts``), then finishes the commit of the checkpoint it restores from,
    then drops every later staged row: those rows are replayed.
    """

    def __init__(self, config: dict, schema: Schema, context: dict) -> None:
        self.writer = writer_key(context)
        self.conn = connect_sink(config, context, self.writer)
        self.custom = custom_statement(config["query"]) if config.get("query") else None
        self.fit = staged(schema) if self.custom else (lambda row: row)
        self.keys = upsert_keys(config)
        if self.custom:  # a stage of the incoming fields, shared by the query's writers
            self.columns = schema.names
            # Per query and incoming fields: another job's query of other fields has its own.
            shape = config["query"] + repr(schema.fields)
            digest = hashlib.blake2b(shape.encode(), digest_size=8).hexdigest()
            schema_name, name = "public", f"keel_query_{digest}"
            self.table = None
        else:
            self.columns = target_columns(config, schema)
            schema_name, name = split_table(config["table"])
            self.table = sql.Identifier(schema_name, name)
        self.stage = sql.Identifier(schema_name, f"{name}__keel_stage")
        self.cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)
        fence_older_attempts(self.conn, self.writer, context.get("attempt", 0))
        self._ensure_stage(schema_name, name, schema)
        restored = context.get("restoredCheckpoint")
        if restored is not None:
            self._commit_upto(restored)
        self.conn.execute(
            sql.SQL(
                "DELETE FROM {stage} WHERE keel_writer = %s AND "
                "(keel_checkpoint IS NULL OR keel_checkpoint > %s)"
            ).format(stage=self.stage),
            (self.writer, restored if restored is not None else -1),
        )
        self.conn.commit()
        self.copy = sql.SQL("COPY {stage} ({cols}, keel_writer) FROM STDIN").format(
            stage=self.stage, cols=self.cols
        )

    def _ensure_stage(self, schema_name: str, name: str, schema: Schema) -> None:
        """Create the staging table once. DDL takes an exclusive lock, so it runs only when
        something is missing: never queued behind another writer's open COPY."""
        present = self.conn.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = %s AND column_name IN ('keel_writer', 'keel_checkpoint', "
            "'keel_seq')",
            (schema_name, f"{name}__keel_stage"),
        ).fetchone()[0]
        self.conn.commit()
        if present == 3:
            return
        # Readers of one job open their writers at the same moment: serialise the DDL (two
        # concurrent CREATE TABLE IF NOT EXISTS can both try to create the table).
        self.conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"keel-stage:{schema_name}.{name}",)
        )
        if self.table is None:
            typed = sql.SQL(", ").join(
                sql.SQL("{c} {t}").format(
                    c=sql.Identifier(c), t=sql.SQL(STAGE_TYPES.get(kind_args(k)[0], "text"))
                )
                for c, k in zip(self.columns, schema.kinds, strict=True)
            )
            self.conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {stage} ({typed})").format(
                    stage=self.stage, typed=typed
                )
            )
        else:
            self.conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {stage} AS SELECT {cols} FROM {t} WITH NO DATA"
                ).format(stage=self.stage, cols=self.cols, t=self.table)
            )
        for ddl in (
            "ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS keel_writer text",
            "ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS keel_checkpoint bigint",
            "ALTER TABLE {stage} ADD COLUMN IF NOT EXISTS keel_seq bigserial",
        ):
            self.conn.execute(sql.SQL(ddl).format(stage=self.stage))
        self.conn.commit()

    def write(self, rows: list[tuple]) -> None:
        with self.conn.cursor() as cur, cur.copy(self.copy) as copy:
            for row in rows:
                copy.write_row((*self.fit(row), self.writer))
        self.conn.commit()

    def prepare_commit(self, checkpoint_id: int) -> dict:
        self.conn.execute(
            sql.SQL(
                "UPDATE {stage} SET keel_checkpoint = %s WHERE keel_writer = %s "
                "AND keel_checkpoint IS NULL"
            ).format(stage=self.stage),
            (checkpoint_id, self.writer),
        )
        self.conn.commit()
        return {"writer": self.writer, "checkpoint": checkpoint_id}

    def commit(self, state: dict) -> None:
        self._commit_upto(state["checkpoint"])

    def _commit_upto(self, checkpoint_id: int | None, include_untagged: bool = False) -> None:
        if checkpoint_id is None:
            checkpoint_id = 2**62 if include_untagged else -1
        where = sql.SQL("keel_writer = {w} AND (keel_checkpoint <= {n}{untagged})").format(
            w=sql.Literal(self.writer),
            n=sql.Literal(checkpoint_id),
            untagged=sql.SQL(" OR keel_checkpoint IS NULL" if include_untagged else ""),
        )
        with self.conn.cursor() as cur:
            # One commit of this writer's rows at a time (a fenced attempt may still be
            # committing): the second sees the rows the first moved as gone.
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"keel-commit:{self.writer}",)
            )
            if self.custom:
                cur.execute(
                    sql.SQL("SELECT {cols} FROM {stage} WHERE {w} ORDER BY keel_seq").format(
                        cols=self.cols, stage=self.stage, w=where
                    )
                )
                cur.executemany(self.custom, cur.fetchall())
            else:
                cur.execute(
                    _insert_from(
                        self.table,
                        self.cols,
                        self.stage,
                        where,
                        sql.Identifier("keel_seq"),
                        self.columns,
                        self.keys,
                    )
                )
            cur.execute(sql.SQL("DELETE FROM {stage} WHERE {w}").format(stage=self.stage, w=where))
        self.conn.commit()

    def close(self) -> None:
        """A batch pipeline finished: everything it wrote becomes visible."""
        self._commit_upto(None, include_untagged=True)
        self.conn.close()

    def abort(self) -> None:
        self.conn.close()
