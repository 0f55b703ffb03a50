"""SeaTunnel's options of the LocalFile source and sink that Keel accepts without effect, each
with why (the submit answer's warning says it): options of its other file systems (HDFS,
Kerberos), of formats Keel writes one way, and of the other side (a sink's options in a source
block, which SeaTunnel ignores). And the source's own options of the managed lane (discovery of
new files in a STREAMING job), which Lane B does not act on."""

from __future__ import annotations

from engine.connectors.base import Option

#: The managed lane's discovery (engine.connectors.localfile_managed); Lane B warns about them.
DISCOVERY_OPTIONS = (
    Option(
        "file.discovery.interval",
        int,
        min=1,
        help="ms between scans of the directory for new files (managed lane, STREAMING)",
    ),
    Option(
        "file.discovery.max-file-age",
        int,
        min=1,
        help="ms: files are remembered this long after their ctime; a file first found older "
        "than this is not read (default 60000, managed lane)",
    ),
)

SCHEMA_CHANGES_HELP = (
    "managed lane: a file with new columns changes the job's schema (the sinks follow: a Jdbc "
    "table gets the columns) instead of their being left out"
)

#: The directory under a sink's path where its parts are staged before they are published.
TMP_DIR = ".keel-tmp"

ISO_DATES = "dates, times and timestamps are read and written in ISO 8601"
HDFS = "an option of SeaTunnel's HDFS file systems; LocalFile reads the local file system"
#: Both sides.
COMMON_IGNORED = {
    "date_format": ISO_DATES,
    "datetime_format": ISO_DATES,
    "time_format": ISO_DATES,
    "xml_root_tag": "Keel has no xml format",
    "xml_row_tag": "Keel has no xml format",
    "xml_use_attr_format": "Keel has no xml format",
    "hdfs_site_path": HDFS,
    "remote_user": HDFS,
    "kerberos_principal": HDFS,
    "krb5_path": HDFS,
    "kerberos_keytab_path": HDFS,
    "fs.defaultFS": HDFS,
}

SINK_IGNORED = COMMON_IGNORED | {
    "is_enable_transaction": "each part is always published atomically, when its "
    "checkpoint (or its reader) completes",
    "tmp_path": f"parts are staged in {TMP_DIR} under the sink's path (one file system: "
    "publishing is a rename)",
    "batch_size": "a part holds what its reader wrote until its checkpoint",
    "single_file_mode": "each reader writes its own parts (Keel never merges them)",
    "create_empty_file_when_no_data": "an unpartitioned sink always publishes its part",
    "max_rows_in_memory": "Excel parts are streamed to disk",
    "csv_string_quote_mode": "csv quotes only where a value needs it",
    "parquet_avro_write_timestamp_as_int96": "Parquet timestamps are written as INT64 "
    "microseconds, which every current reader takes",
    "parquet_avro_write_fixed_as_int96": "Parquet timestamps are written as INT64 microseconds",
    "multi_table_sink_replica": "a multi-table source's tables run as pipelines of their own",
}

#: A sink's options that SeaTunnel's real job files also put in source blocks (it ignores them).
SINK_ONLY = "an option of the LocalFile sink, which a source ignores (as SeaTunnel does)"
SOURCE_IGNORED = COMMON_IGNORED | {
    "archive_compress_codec": "archives are not opened; point path at the files",
    **dict.fromkeys(
        (
            "partition_by",
            "partition_dir_expression",
            "is_partition_field_write_in_file",
            "file_name_expression",
            "filename_time_format",
            "custom_filename",
            "is_enable_transaction",
            "have_partition",
            "sink_columns",
            "tmp_path",
            "enable_header_write",
            "batch_size",
        ),
        SINK_ONLY,
    ),
}
