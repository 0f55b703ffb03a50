"""SeaTunnel job files run unchanged: the corpus under ``tests/seatunnel_corpus/`` (written from
SeaTunnel's connector docs, and taken from its e2e job files with the counts its e2e tests
expect) is submitted to a cluster through the REST API, every job finishes, and each
``# expect:`` count is exact. A second test checks that the corpus uses every option SeaTunnel
documents for each plugin Keel has."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openpyxl import Workbook, load_workbook
from pyarrow import orc

from engine.jobconfig import flatten_options, parse_job_config
from tests.clusterkit import SERVER_URL, Cluster, admin_conn
from tests.test_jobs_cluster import job, post, wait_status

pytestmark = pytest.mark.cluster

CORPUS = Path(__file__).parent / "seatunnel_corpus"
TERMINAL = {"FINISHED", "FAILED", "CANCELED"}

#: The options SeaTunnel's docs list for each plugin Keel has (common options included).
DOCUMENTED = {
    ("source", "fakesource"): """result_table_name parallelism schema rows row.num split.num
        split.read-interval map.size array.size bytes.length string.length tables_configs
        tinyint.fake.mode tinyint.min tinyint.max tinyint.template smallint.fake.mode
        smallint.min smallint.max smallint.template int.fake.mode int.min int.max int.template
        bigint.fake.mode bigint.min bigint.max bigint.template float.fake.mode float.min
        float.max float.template double.fake.mode double.min double.max double.template
        string.fake.mode string.template date.year.template date.month.template
        date.day.template time.hour.template time.minute.template time.second.template
        vector.dimension binary.vector.dimension vector.float.min vector.float.max""",
    ("source", "localfile"): """result_table_name path file_format_type read_columns delimiter
        row_delimiter field_delimiter parse_partition_from_path date_format datetime_format
        time_format skip_header_row_number schema sheet_name xml_row_tag xml_use_attr_format
        csv_use_header_line file_filter_pattern compress_codec archive_compress_codec encoding
        null_format binary_chunk_size binary_complete_file_mode quote_char escape_char""",
    ("sink", "localfile"): """source_table_name path custom_filename file_name_expression
        filename_time_format file_format_type field_delimiter row_delimiter have_partition
        partition_by partition_dir_expression is_partition_field_write_in_file sink_columns
        is_enable_transaction batch_size single_file_mode create_empty_file_when_no_data
        compress_codec max_rows_in_memory sheet_name csv_string_quote_mode xml_root_tag
        xml_row_tag xml_use_attr_format enable_header_write encoding schema_save_mode
        data_save_mode tmp_path date_format datetime_format time_format
        parquet_avro_write_timestamp_as_int96 parquet_avro_write_fixed_as_int96""",
    ("source", "jdbc"): """result_table_name url driver user password query table_path
        where_condition connection_check_timeout_sec partition_column partition_upper_bound
        partition_lower_bound partition_num fetch_size properties decimal_type_narrowing
        int_type_narrowing handle_blob_as_string split.size
        split.even-distribution.factor.upper-bound split.even-distribution.factor.lower-bound
        split.sample-sharding.threshold split.inverse-sampling-rate split.inverse-sampling.rate
        use_select_count skip_analyze compatible_mode table_list""",
    ("sink", "jdbc"): """source_table_name url driver user password query database table
        primary_keys support_upsert_by_query_primary_key_exist connection_check_timeout_sec
        max_retries batch_size is_exactly_once generate_sink_sql xa_data_source_class_name
        max_commit_attempts transaction_timeout_sec auto_commit field_ide properties
        schema_save_mode data_save_mode custom_sql enable_upsert use_copy_statement dialect
        compatible_mode create_index""",
    ("sink", "console"): "source_table_name log.print.data log.print.delay.ms",
    ("transform", "sql"): "source_table_name result_table_name query",
    ("transform", "copy"): "source_table_name result_table_name fields src_field dest_field",
    ("transform", "replace"): """source_table_name result_table_name replace_field pattern
        replacement is_regex replace_first""",
    ("transform", "filterrowkind"): """source_table_name result_table_name include_kinds
        exclude_kinds""",
    ("transform", "fieldmapper"): "source_table_name result_table_name field_mapper",
    ("transform", "filter"): "source_table_name result_table_name include_fields exclude_fields",
}


def corpus() -> list[Path]:
    return sorted(CORPUS.glob("*.conf"))


def expectations(path: Path) -> list[list[str]]:
    return [
        line.split(":", 1)[1].split()
        for line in path.read_text().splitlines()
        if line.startswith("# expect:")
    ]


def test_the_corpus_uses_every_documented_option():
    variables = {"DATA": "/d", "PG": "jdbc:postgresql://h/db", "PGDB": "db"}
    used: dict[tuple[str, str], set[str]] = {}
    for path in corpus():
        parsed = parse_job_config(path.read_text(), variables)
        for section in ("source", "transform", "sink"):
            for block in parsed.section(section):
                leaves = set(flatten_options(block.options))
                leaves |= {leaf.split(".", 1)[0] for leaf in leaves}  # objects: schema { ... }
                used.setdefault((section, block.name.lower()), set()).update(leaves)
    missing = {
        f"{section} {plugin}": sorted(set(names.split()) - used.get((section, plugin), set()))
        for (section, plugin), names in DOCUMENTED.items()
    }
    assert {k: v for k, v in missing.items() if v} == {}
    assert all(expectations(p) for p in corpus()), "every corpus file says what it expects"


# -- running the corpus ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus_db():
    name = f"keel_corpus_{os.getpid()}"
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = f"{SERVER_URL}/{name}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE corpus_src (id bigint PRIMARY KEY, name text, age int,"
            " price numeric(10, 2))"
        )
        conn.execute(
            "INSERT INTO corpus_src SELECT g, 'name-' || g, (g % 7) * 10, g * 0.25"
            " FROM generate_series(1, 1000) g"
        )
        conn.execute(
            "CREATE TABLE corpus_upsert (id bigint PRIMARY KEY, name text, age int,"
            " price numeric(10, 2))"
        )
        conn.execute("CREATE TABLE corpus_text (id bigint, note text)")
        conn.execute("CREATE TABLE corpus_log (id bigint, note text)")
        create_e2e_tables(conn)
    yield dsn, name
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: pg_e2e_source_table's columns as JdbcPostgresIT creates them, but PostGIS's geometries and
#: xml_col (types Keel does not read).
PG_E2E_COLUMNS = """gid SERIAL PRIMARY KEY, uuid_col UUID, text_col TEXT, varchar_col VARCHAR(255),
    char_col CHAR(10), boolean_col bool, smallint_col int2, integer_col int4, bigint_col BIGINT,
    decimal_col DECIMAL(10, 2), numeric_col NUMERIC(8, 4), real_col float4,
    double_precision_col float8, smallserial_col SMALLSERIAL, serial_col SERIAL,
    bigserial_col BIGSERIAL, date_col DATE, timestamp_col TIMESTAMP, bpchar_col BPCHAR(10),
    age INT NOT null, name VARCHAR(255) NOT null, json_col json NOT NULL,
    jsonb_col jsonb NOT NULL"""


def create_e2e_tables(conn: psycopg.Connection) -> None:
    """The tables SeaTunnel's e2e tests create before the jobs the corpus took from them run:
    JdbcAutoGenerateSQLIT's ``sink`` (here with 7 stale rows, for DROP_DATA to remove),
    JdbcPostgresIT's 1000 rows, JdbcMysqlMultipleTablesIT's ``source``/``sink`` tables of 100
    rows each (schemas for its databases; a primary key here, which Keel needs to read a table
    without a partition_column)."""
    conn.execute(
        "CREATE TABLE sink (user_id BIGINT NOT NULL PRIMARY KEY, name varchar(255), age INT)"
    )
    conn.execute("INSERT INTO sink SELECT 1000 + g, 'stale', 0 FROM generate_series(1, 7) g")
    for table in ("pg_e2e_source_table", "pg_e2e_sink_table"):
        conn.execute(f"CREATE TABLE {table} ({PG_E2E_COLUMNS})")
    conn.execute(
        "INSERT INTO pg_e2e_source_table SELECT g, gen_random_uuid(), 'Hello World', 'Test',"
        " 'Testing', true, 10, 100, 1000, 10.55, 8.8888, 3.14, 3.14159265, 1, 100, 10000,"
        " '2023-05-07', '2023-05-07 14:30:00', 'Testing', 21, 'Leblanc', %s::json, %s::jsonb"
        " FROM generate_series(1, 1000) g",
        ('{"key":"value"}', '{"key":"value"}'),
    )
    for schema in ("source", "sink"):
        conn.execute(f"CREATE SCHEMA {schema}")
        for table in ("table1", "table2"):
            conn.execute(
                f"CREATE TABLE {schema}.{table} (c_int int PRIMARY KEY, c_bigint bigint,"
                " c_varchar varchar(255), c_decimal decimal(20, 0), c_date date)"
            )
            if schema == "source":
                conn.execute(
                    f"INSERT INTO source.{table} SELECT g, g * 10, 'v' || g, g,"
                    " DATE '2024-01-01' + g FROM generate_series(0, 99) g"
                )


def write_inputs(data: Path) -> None:
    """The files the corpus's LocalFile sources read, and a stale part a save mode removes."""
    stale = data / "out" / "savemode" / "fake"
    stale.mkdir(parents=True)
    (stale / "stale.json").write_text('{"c_string": "stale"}\n' * 3)
    people = data / "in" / "people"
    for city, rows in (("paris", "1;'Ann';30\n2;NULL;40\n"), ("rome", "3;'B;o';50\n4;x;60\n")):
        (people / f"city={city}").mkdir(parents=True)
        (people / f"city={city}" / "part.csv").write_text(f"id;name;age\n{rows}")
    (people / "notes.txt").write_text("not a csv part\n")
    (data / "in" / "lines.txt").write_text("id|note\n1|a\n2|b\n3|c\n")
    table = pa.table(
        {
            "id": pa.array(range(6), pa.int64()),
            "name": [f"n{i}" for i in range(6)],
            "price": pa.array([i * 0.5 for i in range(6)], pa.float64()),
        }
    )
    for fmt in ("parquet", "orc"):
        (data / "in" / fmt).mkdir(parents=True)
    pq.write_table(table, data / "in" / "parquet" / "part.parquet")
    orc.write_table(table, str(data / "in" / "orc" / "part.orc"))
    (data / "in" / "excel").mkdir()
    book = Workbook()
    sheet = book.active
    sheet.title = "data"
    sheet.append(["id", "name"])
    for i in range(6):
        sheet.append([i, f"n{i}"])
    book.save(data / "in" / "excel" / "part.xlsx")
    (data / "in" / "binary").mkdir()
    (data / "in" / "binary" / "a.bin").write_bytes(os.urandom(4000))
    (data / "in" / "binary" / "b.bin").write_bytes(b"tiny")


def records(directory: Path, header: bool) -> int:
    """Records in every part under ``directory`` (partition directories included)."""
    total = 0
    for part in (p for p in directory.rglob("*") if p.is_file() and ".keel-tmp" not in p.parts):
        if part.suffix == ".parquet":
            total += pq.read_metadata(part).num_rows
        elif part.suffix == ".orc":
            total += orc.ORCFile(str(part)).nrows
        elif part.suffix == ".xlsx":
            rows = list(load_workbook(part, read_only=True).worksheets[0].iter_rows())
            total += len(rows) - (1 if header and rows else 0)
        else:
            data = part.read_bytes()
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            lines = [ln for ln in data.decode().splitlines() if ln]
            total += len(lines) - (1 if header and lines else 0)
    return total


def test_every_corpus_job_runs_with_exact_counts(db_template, corpus_db, tmp_path):
    dsn, dbname = corpus_db
    write_inputs(tmp_path)
    variables = {
        "DATA": str(tmp_path),
        "PG": "jdbc:" + dsn.replace("postgres://", "postgresql://"),
        "PGDB": dbname,
    }
    # worker-1 has the tags of SeaTunnel's resource-isolation e2e member (for tag_filter).
    tags = ("--worker-tags", "worker-1:group=platform,team=team1")
    with Cluster(db_template, masters=1, workers=2, slots=8, extra_args=tags) as c:
        submitted = {}
        for path in corpus():
            code, body = post(
                c, "/api/v1/jobs", {"config": path.read_text(), "variables": variables}
            )
            assert code == 201, (path.name, body)
            submitted[path.name] = body["jobId"]
        details = {
            name: wait_status(c, job_id, TERMINAL, timeout=120)
            for name, job_id in submitted.items()
        }
        failed = {n: d["errorMsg"] for n, d in details.items() if d["jobStatus"] != "FINISHED"}
        assert failed == {}
        counts, wanted = {}, {}
        for path in corpus():
            for kind, *args in expectations(path):
                key = f"{path.name}: {kind} {args[0]}"
                wanted[key] = int(args[1] if kind != "written" else args[0])
                if kind == "files":
                    counts[key] = records(tmp_path / args[0], header="header" in args[2:])
                elif kind == "table":
                    with psycopg.connect(dsn) as conn:
                        counts[key] = conn.execute(f"SELECT count(*) FROM {args[0]}").fetchone()[0]
                else:
                    counts[key] = job(c, submitted[path.name])["metrics"]["sinkWriteCount"]
        assert counts == wanted
        hosts = c.query(
            "SELECT DISTINCT m.name FROM engine_taskgroup g JOIN engine_member m"
            " ON m.id = g.member_id WHERE g.job_id = %s",
            (submitted["fake_tag_filter_to_console.conf"],),
        )
        assert hosts == [("worker-1",)], "tag_filter places the job on the tagged worker only"
