"""SeaTunnel's LocalFile options beyond its docs, as its own job files use them: a multi-table
source (``tables_configs``), ``read_partitions``, formats named in any case, sink options in a
source block and HDFS options (accepted, warned about), booleans given as strings or as ``-i``
variables inside quoted strings, and the files SeaTunnel's listing leaves out."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.jobconfig import ConfigError, check_variables, parse_job_config
from engine.jobs.planner import plan_job
from tests.localrun import run_batch


def lines(directory) -> list[dict]:
    return [json.loads(ln) for p in sorted(directory.rglob("*.jsonl")) for ln in p.open()]


def test_tables_configs_makes_a_pipeline_per_table_parquet_bringing_its_fields(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.json").write_text('{"id": 1}\n{"id": 2}\n')
    (tmp_path / "b").mkdir()
    pq.write_table(pa.table({"name": ["x", "y", "z"]}), tmp_path / "b" / "1.parquet")
    result = run_batch(f"""
    env {{ job.mode = BATCH }}
    source {{ LocalFile {{ tables_configs = [
      {{ path = "{tmp_path}/a", file_format_type = json,
         schema {{ table = "shop.ids", fields {{ id = bigint }} }} }},
      {{ path = "{tmp_path}/b", file_format_type = PARQUET, schema {{ table = "shop.names" }} }}
    ] }} }}
    sink {{ LocalFile {{ path = "{tmp_path}/out/${{table_name}}", file_format_type = json }} }}
    """)
    assert result["written"] == 5
    assert sorted(r["id"] for r in lines(tmp_path / "out" / "ids")) == [1, 2]
    assert sorted(r["name"] for r in lines(tmp_path / "out" / "names")) == ["x", "y", "z"]


def test_a_table_entry_without_its_table_name_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError) as caught:
        plan_job(f"""source {{ LocalFile {{ tables_configs = [
          {{ path = "{tmp_path}", file_format_type = json, schema {{ fields {{ id = int }} }} }}
        ] }} }}
        sink {{ Console {{}} }}""")
    [error] = caught.value.errors
    assert error["path"] == "source[0].LocalFile.tables_configs[0]"
    assert error["message"].startswith("needs schema { table = name }")


def test_read_partitions_and_the_files_seatunnel_does_not_list(tmp_path):
    for k in (1, 2):
        (tmp_path / f"k={k}").mkdir()
        (tmp_path / f"k={k}" / "part.json").write_text(f'{{"id": {k}}}\n')
    (tmp_path / "k=1" / "_SUCCESS").write_text("")
    (tmp_path / "k=1" / "empty.json").write_text("")
    source = f'path = "{tmp_path}", file_format_type = json, schema {{ fields {{ id = int }} }}'
    sink = f'sink {{ LocalFile {{ path = "{tmp_path}/out", file_format_type = json }} }}'
    plan = plan_job(f'source {{ LocalFile {{ {source}, read_partitions = ["k=1"] }} }}\n{sink}')
    from engine.member.dataplane import instantiate

    splits = instantiate(plan.pipelines[0].to_json()["source"]).create_splits("BATCH")
    assert [s["relativePath"] for s in splits] == ["k=1/part.json"]


def test_formats_in_any_case_and_xml_refused_saying_why(tmp_path):
    sink = f'sink {{ LocalFile {{ path = "{tmp_path}", file_format_type = "Text" }} }}'
    plan = plan_job(f"source {{ FakeSource {{ schema {{ fields {{ id = int }} }} }} }}\n{sink}")
    assert plan.pipelines[0].sinks[0].config["file_format_type"] == "text"
    with pytest.raises(ConfigError) as caught:
        plan_job(sink.replace('"Text"', "xml").replace("sink", "source") + "sink { Console {} }")
    assert "(Keel has no xml format)" in caught.value.errors[0]["message"]


def test_sink_and_hdfs_options_in_a_source_are_accepted_with_a_warning(tmp_path):
    (tmp_path / "1.json").write_text('{"id": 1}\n')
    plan = plan_job(f"""source {{ LocalFile {{
        path = "{tmp_path}", file_format_type = json, schema {{ fields {{ id = int }} }},
        partition_dir_expression = "${{k0}}=${{v0}}", is_enable_transaction = true,
        remote_user = hdfs }} }}
    sink {{ LocalFile {{ path = "{tmp_path}/out", parquet_avro_write_timestamp_as_int96 = true,
        multi_table_sink_replica = 2 }} }}""")
    warned = {w["path"].split(".", 2)[-1]: w["message"] for w in plan.warnings}
    assert warned["partition_dir_expression"].startswith(
        "no effect: an option of the LocalFile sink"
    )
    assert "HDFS" in warned["remote_user"]
    assert "INT64" in warned["parquet_avro_write_timestamp_as_int96"]
    assert "multi_table_sink_replica" in warned


def test_header_given_as_a_variable_inside_a_quoted_string(tmp_path):
    """SeaTunnel's batch_fakesource_to_file_header.conf, with its variables."""
    config = f"""
    env {{ job.mode = "BATCH" }}
    source {{ FakeSource {{ row.num = 1, schema {{ fields {{ name = string, age = int }} }} }} }}
    sink {{ LocalFile {{ path = "{tmp_path}", file_format_type = "${{file_format_type}}",
        enable_header_write = "${{enable_header_write}}" }} }}
    """
    run_batch(config, variables={"file_format_type": "csv", "enable_header_write": "True"})
    [part] = tmp_path.glob("*.csv")
    assert part.read_text().splitlines()[0] == "name,age"
    with pytest.raises(ConfigError) as caught:
        plan_job(config)
    assert "pass the variable enable_header_write" in str(caught.value.errors)


def test_quoted_variables_take_values_then_defaults_and_placeholders_stay():
    job = parse_job_config(
        """env { job.name = "${jobName:fake_default}" }
        source { FakeSource { plugin_output = "${res:fake}_table", row.num = "${rows:50}" } }
        sink { LocalFile { path = "data/${dir}", file_name_expression = "${transactionId}_${now}",
            partition_dir_expression = "${k0}=${v0}", custom = "${table_name:t}${?unset}" } }""",
        {"rows": "7", "dir": "out"},
    )
    assert job.env["job.name"] == "fake_default"
    assert job.blocks["source"][0].options["plugin_output"] == "fake_table"
    assert job.blocks["source"][0].options["row"]["num"] == "7"
    sink = job.blocks["sink"][0].options
    assert sink["path"] == "data/out"
    assert sink["file_name_expression"] == "${transactionId}_${now}"
    assert sink["partition_dir_expression"] == "${k0}=${v0}"
    assert sink["custom"] == "${table_name:t}"


def test_a_table_placeholder_cannot_be_a_variable():
    with pytest.raises(ConfigError) as caught:
        check_variables({"table_name": "x"})
    assert caught.value.errors[0]["path"] == "variables.table_name"
    assert "table placeholder" in caught.value.errors[0]["message"]
