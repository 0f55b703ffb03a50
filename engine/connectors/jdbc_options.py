"""The Jdbc connector's SeaTunnel options that both sides share, which database a block names,
and the options of SeaTunnel's that change nothing here (each with why)."""

from __future__ import annotations

from engine.connectors.base import Option
from engine.connectors.jdbc_url import subprotocol

#: The PostgreSQL JDBC driver: configs written for SeaTunnel name it.
POSTGRES_DRIVER = "org.postgresql.Driver"
#: JDBC drivers SeaTunnel's configs name, by the database they reach.
DRIVERS = {
    POSTGRES_DRIVER: "PostgreSQL",
    "com.mysql.cj.jdbc.Driver": "MySQL",
    "com.mysql.jdbc.Driver": "MySQL",
    "org.mariadb.jdbc.Driver": "MariaDB",
    "oracle.jdbc.OracleDriver": "Oracle",
    "oracle.jdbc.driver.OracleDriver": "Oracle",
    "com.microsoft.sqlserver.jdbc.SQLServerDriver": "SQL Server",
    "com.ibm.db2.jcc.DB2Driver": "DB2",
    "dm.jdbc.driver.DmDriver": "DM (Dameng)",
    "com.intersystems.jdbc.IRISDriver": "InterSystems IRIS",
    "com.teradata.jdbc.TeraDriver": "Teradata",
    "com.vertica.jdbc.Driver": "Vertica",
    "net.snowflake.client.jdbc.SnowflakeDriver": "Snowflake",
    "com.sap.db.jdbc.Driver": "SAP HANA",
    "com.kingbase8.Driver": "KingbaseES",
    "org.opengauss.Driver": "openGauss",
    "com.oceanbase.jdbc.Driver": "OceanBase",
    "com.xugu.cloudjdbc.Driver": "XuGu",
    "com.pivotal.jdbc.GreenplumDriver": "Greenplum (Pivotal driver)",
    "org.apache.phoenix.queryserver.client.Driver": "Apache Phoenix",
    "org.sqlite.JDBC": "SQLite",
    "org.apache.hive.jdbc.HiveDriver": "Hive",
    "com.amazon.redshift.jdbc42.Driver": "Amazon Redshift",
    "com.mysql.cj.jdbc.MysqlXADataSource": "MySQL",
    "ru.yandex.clickhouse.ClickHouseDriver": "ClickHouse",
    "com.clickhouse.jdbc.ClickHouseDriver": "ClickHouse",
    "org.duckdb.DuckDBDriver": "DuckDB",
}
#: The databases Keel's Jdbc connector reaches, by family (engine.connectors.dialects).
FAMILIES = {"PostgreSQL": "PostgreSQL", "MySQL": "MySQL", "MariaDB": "MySQL"}
#: A URL's subprotocol, by the database it reaches.
SUBPROTOCOLS = {"postgresql": "PostgreSQL", "postgres": "PostgreSQL", "mysql": "MySQL"} | {
    "mariadb": "MariaDB",
    "oracle": "Oracle",
    "sqlserver": "SQL Server",
    "db2": "DB2",
    "dm": "DM (Dameng)",
    "iris": "InterSystems IRIS",
    "teradata": "Teradata",
    "vertica": "Vertica",
    "snowflake": "Snowflake",
    "sap": "SAP HANA",
    "kingbase8": "KingbaseES",
    "opengauss": "openGauss",
    "oceanbase": "OceanBase",
    "xugu": "XuGu",
    "pivotal": "Greenplum (Pivotal driver)",
    "phoenix": "Apache Phoenix",
    "sqlite": "SQLite",
    "hive2": "Hive",
    "redshift": "Amazon Redshift",
    "clickhouse": "ClickHouse",
    "duckdb": "DuckDB",
}


def database_refusal(config: dict) -> tuple[str, str] | None:
    """(option, message) when the block's driver or URL is not a database Keel reaches
    (PostgreSQL, MySQL, MariaDB): an environment refusal (Keel has no client for that
    database), not a fault of the config; or when the driver and the URL name two."""
    driver = config.get("driver") or POSTGRES_DRIVER
    url = config.get("url") or ""
    sub = subprotocol(url) if url else ""
    by_url = SUBPROTOCOLS.get(sub, sub) if url else ""
    by_driver = DRIVERS.get(driver, "")
    if driver != POSTGRES_DRIVER and by_driver not in FAMILIES:
        option, what = "driver", f"driver {driver} ({by_driver or 'another database'})"
    elif url and by_url not in FAMILIES:
        option, what = "url", f"url jdbc:{sub}: ({by_url or 'another database'})"
    elif driver != POSTGRES_DRIVER and url and FAMILIES[by_driver] != FAMILIES[by_url]:
        return ("driver", f"{driver} is {by_driver}'s driver, the url is {by_url}'s")
    else:
        return None
    return (
        option,
        "Keel's Jdbc connector reads and writes PostgreSQL and MySQL/MariaDB; "
        f"{what} is not available here (not PostgreSQL or MySQL/MariaDB)",
    )


COMMON = (
    Option(
        "url",
        str,
        default="",
        help="jdbc:postgresql://host:port/database or jdbc:mysql://host:port/database [?params]",
    ),
    Option("user", str, default=""),
    Option("password", str, default=""),
    Option(
        "connection",
        str,
        default="",
        help="a named connection (url, user and password an admin stored) instead",
    ),
    Option(
        "driver",
        str,
        default=POSTGRES_DRIVER,
        help=f"{POSTGRES_DRIVER}, com.mysql.cj.jdbc.Driver or org.mariadb.jdbc.Driver",
    ),
    Option("database", str, default="", help="must be the url's database"),
    Option("schema", str, default="", help="the table's schema (when table names none)"),
    Option(
        "properties",
        dict,
        default=None,
        help="the driver's connection properties (currentSchema, sslmode, useSSL, ...)",
    ),
    Option("connect_timeout_ms", int, default=None, min=0, help="connect timeout (ms)"),
)
#: SeaTunnel's newer names of common options.
COMMON_ALIASES = {"username": "user", "base-url": "url"}
#: SeaTunnel's options of both sides that change nothing here.
COMMON_IGNORED = {
    "connection_check_timeout_sec": "connections time out after 5 s (or the url's connectTimeout)",
    "socket_timeout_ms": "sink sessions have their own statement and idle timeouts",
    "compatible_mode": "PostgreSQL only",
    "dialect": "the url says which database it is",
    "use_kerberos": "Keel's client authenticates with user and password",
    "kerberos_principal": "Keel's client authenticates with user and password",
    "kerberos_keytab_path": "Keel's client authenticates with user and password",
    "krb5_path": "Keel's client authenticates with user and password",
    "access_key_id": "Keel's client authenticates with user and password",
    "secret_access_key": "Keel's client authenticates with user and password",
    "region": "Keel's client authenticates with user and password",
}
#: SeaTunnel's split options: the spellings of its code and of its docs.
SPLIT_OPTIONS = (
    Option("split.size", int, default=None, min=1, help="rows per split of a key's ranges"),
    Option("split.even-distribution.factor.upper-bound", float, default=100.0, min=0),
    Option("split.even-distribution.factor.lower-bound", float, default=0.05, min=0),
    Option("split.sample-sharding.threshold", int, default=1000, min=1),
    Option("split.inverse-sampling.rate", int, default=None, min=1),
    Option("split.inverse-sampling-rate", int, default=None, min=1, help="the docs' spelling"),
)
#: SeaTunnel's default ``split.inverse-sampling.rate``.
INVERSE_SAMPLING_RATE = 1000
SOURCE_IGNORED = {
    "use_select_count": "the split query counts rows itself",
    "skip_analyze": "Keel does not ANALYZE tables",
    "split.string_split_mode": "a column that is not an integer is cut at its quantiles",
    "split.string_split_mode_collate": "a column that is not an integer is cut at its quantiles",
    "split.string-strategy": "a column that is not an integer is cut at its quantiles",
    "split.allow-sampling": "split.sample-sharding.threshold says when a key is sampled",
    "decimal_type_narrowing": "numeric columns are read as decimals",
    "int_type_narrowing": "integer columns keep their type",
    "handle_blob_as_string": "bytea is read as bytes",
    "fetch_size": "each split is read with one binary COPY, in batches of "
    "engine.dataplane.batch-rows rows",
}
SINK_IGNORED = {
    "batch_size": "each batch a reader hands the sink is written with one COPY",
    "max_retries": "a failed write is retried by recovery from the last checkpoint",
    "support_upsert_by_query_primary_key_exist": "upserts on primary_keys use "
    "INSERT ... ON CONFLICT, which is what it asks for",
    "support_upsert_by_insert_only": "upserts on primary_keys use INSERT ... ON CONFLICT",
    "is_primary_key_updated": "an upsert never changes a row's primary key",
    "xa_data_source_class_name": "is_exactly_once prepares PostgreSQL transactions itself",
    "max_commit_attempts": "a commit that fails is retried from the checkpoint",
    "transaction_timeout_sec": "sink sessions end idle transactions after 10 s",
    "auto_commit": "each batch is one transaction",
    "use_copy_statement": "batches are always written with COPY",
    "create_index": "a created table's one index is its primary key, which upserts need",
}
