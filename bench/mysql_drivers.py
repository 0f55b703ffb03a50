"""MySQL drivers: reading 1M rows into Arrow and writing 1M rows, on a private MariaDB
(tests/mariadbkit.py). Each driver installed is measured; the figures chose the dialect's
driver (docs/decisions/0035-mysql-dialect.md). Ratios are to PyMySQL's streaming cursor."""

from __future__ import annotations

import importlib.util
import io
import time

import pyarrow as pa

from tests.mariadbkit import PASSWORD, USER, PrivateMariaDB

ROWS = 1_000_000
COLUMNS = "id bigint PRIMARY KEY, a int, b double, c varchar(40), d datetime(6), e decimal(12,2)"
SELECT = "SELECT id, a, b, c, d, e FROM bench"
CHUNK = 65_536


def _seed(server: PrivateMariaDB) -> None:
    server.execute(
        "DROP TABLE IF EXISTS bench",
        f"CREATE TABLE bench ({COLUMNS})",
        # MariaDB's Sequence engine: the table seq_1_to_N holds 1..N.
        f"INSERT INTO bench SELECT seq, seq % 1000, seq / 7, concat('row-', seq),"
        f" timestamp'2024-01-01 00:00:00' + INTERVAL seq SECOND, seq / 100 FROM seq_1_to_{ROWS}",
    )


def _to_arrow(rows: list[tuple], names: list[str]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays([pa.array(c) for c in columns], names=names)


def _stream(cursor) -> int:
    cursor.execute(SELECT)
    names = [d[0] for d in cursor.description]
    total = 0
    while rows := cursor.fetchmany(CHUNK):
        total += _to_arrow(list(rows), names).num_rows
    return total


def _open(driver: str, server: PrivateMariaDB, **extra):
    """A connection through one driver: they share the DB-API's connect keywords."""
    return importlib.import_module(driver).connect(
        host="127.0.0.1", port=server.port, user=USER, password=PASSWORD, database="keel", **extra
    )


def read_pymysql(server: PrivateMariaDB) -> int:
    cursors = importlib.import_module("pymysql.cursors")
    with _open("pymysql", server, cursorclass=cursors.SSCursor) as conn:
        return _stream(conn.cursor())


def read_mysqlclient(server: PrivateMariaDB) -> int:
    conn = _open("MySQLdb", server, cursorclass=importlib.import_module("MySQLdb.cursors").SSCursor)
    try:
        return _stream(conn.cursor())
    finally:
        conn.close()


def read_mariadb(server: PrivateMariaDB) -> int:
    conn = _open("mariadb", server)
    try:
        return _stream(conn.cursor(buffered=False))
    finally:
        conn.close()


def read_connectorx(server: PrivateMariaDB) -> int:
    import connectorx

    url = f"mysql://{USER}:{PASSWORD}@127.0.0.1:{server.port}/keel"
    reader = connectorx.read_sql(url, SELECT, return_type="arrow_stream", batch_size=CHUNK)
    return sum(batch.num_rows for batch in reader)


def _rows() -> list[tuple]:
    return [
        (i, i % 1000, i / 7, f"row-{i}", "2024-01-01 00:00:00.000000", f"{i / 100:.2f}")
        for i in range(ROWS)
    ]


def _csv(rows: list[tuple]) -> bytes:
    out = io.StringIO()
    for row in rows:
        out.write("\t".join(map(str, row)))
        out.write("\n")
    return out.getvalue().encode()


def write_pymysql_insert(server: PrivateMariaDB, rows: list[tuple]) -> None:
    with _open("pymysql", server) as conn, conn.cursor() as cur:
        for start in range(0, ROWS, CHUNK):
            cur.executemany(
                "INSERT INTO sink VALUES (%s, %s, %s, %s, %s, %s)", rows[start : start + CHUNK]
            )
        conn.commit()


def write_pymysql_load(server: PrivateMariaDB, rows: list[tuple]) -> None:
    import os
    import tempfile

    with _open("pymysql", server, local_infile=True) as conn, conn.cursor() as cur:
        for start in range(0, ROWS, CHUNK):
            with tempfile.NamedTemporaryFile(dir="/dev/shm", delete=False) as f:
                f.write(_csv(rows[start : start + CHUNK]))
            cur.execute(f"LOAD DATA LOCAL INFILE '{f.name}' INTO TABLE sink")
            os.unlink(f.name)
        conn.commit()


def _insert_all(conn, statement: str, rows: list[tuple]) -> None:
    cur = conn.cursor()
    for start in range(0, ROWS, CHUNK):
        cur.executemany(statement, rows[start : start + CHUNK])
    conn.commit()
    conn.close()


def write_mysqlclient_insert(server: PrivateMariaDB, rows: list[tuple]) -> None:
    _insert_all(_open("MySQLdb", server), "INSERT INTO sink VALUES (%s, %s, %s, %s, %s, %s)", rows)


def write_mariadb_bulk(server: PrivateMariaDB, rows: list[tuple]) -> None:
    _insert_all(_open("mariadb", server), "INSERT INTO sink VALUES (?, ?, ?, ?, ?, ?)", rows)


def _timed(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def main() -> None:
    with PrivateMariaDB() as server:
        _seed(server)
        reads = {
            "pymysql": read_pymysql,
            "mysqlclient": read_mysqlclient,
            "mariadb": read_mariadb,
            "connectorx": read_connectorx,
        }
        found = {
            k: f
            for k, f in reads.items()
            if importlib.util.find_spec({"mysqlclient": "MySQLdb"}.get(k, k))
        }
        base = None
        for name, fn in found.items():
            seconds = _timed(fn, server)
            base = base or seconds
            print(f"read 1M rows into Arrow, {name}: {seconds:.2f} s ({seconds / base:.2f}x)")
        rows = _rows()
        writes = {
            "pymysql executemany (multi-row INSERT)": ("pymysql", write_pymysql_insert),
            "pymysql LOAD DATA LOCAL INFILE": ("pymysql", write_pymysql_load),
            "mysqlclient executemany (multi-row INSERT)": ("MySQLdb", write_mysqlclient_insert),
            "mariadb executemany (bulk binary)": ("mariadb", write_mariadb_bulk),
        }
        base = None
        for name, (module, fn) in writes.items():
            if not importlib.util.find_spec(module):
                continue
            server.execute("DROP TABLE IF EXISTS sink", f"CREATE TABLE sink ({COLUMNS})")
            seconds = _timed(fn, server, rows)
            assert server.execute("SELECT count(*) FROM sink")[0][0] == ROWS
            base = base or seconds
            print(f"write 1M rows, {name}: {seconds:.2f} s ({seconds / base:.2f}x)")


if __name__ == "__main__":
    main()
