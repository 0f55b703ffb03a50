"""FakeSource's ``tables_configs``: a pipeline per table, its sinks told the table's names."""

from __future__ import annotations

import json

import pytest

from engine.jobconfig import ConfigError
from engine.jobs.planner import plan_job
from tests.localrun import run_batch

TABLES = """
source { FakeSource { plugin_output = fake, split.num = 2, tables_configs = [
  { schema { table = "shop.orders", fields { id = bigint, amount = "decimal(10, 2)" } },
    row.num = 7 },
  { schema { table = "shop.users", fields { id = int, name = string } }, row.num = 3,
    split.num = 1 }
] } }
"""


def test_each_table_is_a_pipeline_and_its_sink_writes_where_the_table_says(tmp_path):
    result = run_batch(
        f"env {{ job.mode = BATCH }}\n{TABLES}"
        f'sink {{ LocalFile {{ plugin_input = fake, path = "{tmp_path}/${{database_name}}/'
        '${table_name}", file_format_type = json } }'
    )
    # SeaTunnel's counts: row.num rows per reader (one here), whatever split.num is.
    assert result["written"] == 7 + 3
    orders = [
        json.loads(ln)
        for p in (tmp_path / "shop" / "orders").glob("*.jsonl")
        for ln in p.read_text().splitlines()
    ]
    users = [
        json.loads(ln)
        for p in (tmp_path / "shop" / "users").glob("*.jsonl")
        for ln in p.read_text().splitlines()
    ]
    assert len(orders) == 7 and set(orders[0]) == {"id", "amount"}
    assert sorted(u["id"] for u in users) == [0, 1, 2]


def test_the_plan_names_each_table_s_nodes():
    plan = plan_job(f"{TABLES}sink {{ Blackhole {{ plugin_input = fake }} }}")
    assert [p.source.path for p in plan.pipelines] == [
        "source[0].FakeSource.tables_configs[0]",
        "source[0].FakeSource.tables_configs[1]",
    ]
    assert [p.sinks[0].path for p in plan.pipelines] == [
        "sink[0].Blackhole@shop.orders",
        "sink[0].Blackhole@shop.users",
    ]
    assert plan.slots_needed == 2 * (1 + 1)


def test_a_bad_table_entry_is_a_400_that_names_it():
    with pytest.raises(ConfigError) as caught:
        plan_job(
            "source { FakeSource { tables_configs = [ { schema { fields { id = int } } },"
            " { schema { table = t, fields { id = nope } } } ] } }\nsink { Blackhole { } }"
        )
    paths = sorted(e["path"] for e in caught.value.errors)
    assert paths == [
        "source[0].FakeSource.tables_configs[0]",
        "source[0].FakeSource.tables_configs[1].schema.fields.id",
    ]
