"""SeaTunnel's spellings of a job file: plugin names in any case, ``result_table_name`` and
``source_table_name`` for ``plugin_output`` and ``plugin_input``, and env options of other
engines warned about rather than refused (a typo of Keel's own is still a 400, with a hint)."""

from __future__ import annotations

from engine.jobs.planner import plan_job
from engine.models import Job, Pipeline, TaskGroup
from tests.conftest import role_user

SEATUNNEL_STYLE = """
env {
  job.mode = "BATCH"
  parallelism = 1
  spark.executor.memory = "1g"
  flink.execution.checkpointing.interval = 10000
  jars = "file:///opt/connectors/extra.jar"
}
source {
  fakesource { result_table_name = "numbers", row.num = 5 }
  FAKESOURCE { result_table_name = ["letters"], row.num = 7 }
}
sink {
  console { source_table_name = "numbers" }
  BlackHole { source_table_name = ["letters"] }
}
"""


def submit(api, config):
    return api.post("/api/v1/jobs", {"config": config}, format="json")


def test_names_in_any_case_and_the_old_stream_names_plan_like_keels_own():
    plan = plan_job(SEATUNNEL_STYLE)
    wired = [
        (p.source.plugin, p.source.config["plugin_output"], [s.plugin for s in p.sinks])
        for p in plan.pipelines
    ]
    assert wired == [
        ("FakeSource", "numbers", ["Console"]),
        ("FakeSource", "letters", ["Blackhole"]),
    ]
    assert [p.sinks[0].config["plugin_input"] for p in plan.pipelines] == ["numbers", "letters"]


def test_other_engines_options_are_warned_about_and_the_answer_carries_them(api):
    response = submit(api, SEATUNNEL_STYLE)
    assert response.status_code == 201, response.json()
    body = response.json()
    warned = {w["path"]: w["message"] for w in body["warnings"]}
    assert warned == {
        "env.spark.executor.memory": "ignored: an option of Spark",
        "env.flink.execution.checkpointing.interval": "ignored: an option of Flink",
        "env.jars": "no effect: Keel's plugins are built in; no jars are loaded",
    }
    sinks = [
        [s["plugin"] for s in p.plan["sinks"]]
        for p in Pipeline.objects.filter(job_id=body["jobId"]).order_by("index")
    ]
    assert sinks == [["Console"], ["Blackhole"]]  # stored under their own names: workers run them
    plain = submit(api, "source { FakeSource { } }\nsink { Console { } }").json()
    assert plain["warnings"] == []


def test_a_typo_of_a_keel_option_is_still_refused_with_a_hint(api):
    response = submit(
        api, "env { parallelsim = 2 }\nsource { FakeSource { } }\nsink { Console { } }"
    )
    assert response.status_code == 400
    assert response.json()["errors"] == [
        {"path": "env.parallelsim", "message": "unknown env option (did you mean parallelism?)"}
    ]


def test_an_alias_and_its_keel_name_disagreeing_is_refused_naming_the_alias(api):
    config = """
    source { FakeSource { result_table_name = a, plugin_output = b } }
    sink { Console { source_table_name = a, plugin_input = "b, c" } }
    """
    errors = submit(api, config).json()["errors"]
    paths = {e["path"]: e["message"] for e in errors}
    assert paths["source[0].FakeSource.result_table_name"] == "says 'a' but plugin_output says 'b'"
    assert paths["sink[0].Console.source_table_name"] == "says 'a' but plugin_input says 'b, c'"


def test_the_submit_page_shows_the_warnings(client, transactional_db, engine):
    engine.add_member(slots=8)
    client.force_login(role_user("sally", "operator"))
    response = client.post("/submit/", {"config": SEATUNNEL_STYLE}, follow=True)
    page = response.content.decode()
    assert response.status_code == 200
    assert "env.spark.executor.memory: ignored: an option of Spark" in page


def test_a_sources_own_parallelism_sets_its_pipelines_readers(api):
    config = """
    env { parallelism = 2 }
    source {
      FakeSource { plugin_output = wide, parallelism = 3, row.num = 9, split.num = 6 }
      FakeSource { plugin_output = narrow, row.num = 4 }
    }
    sink {
      Blackhole { plugin_input = wide }
      Blackhole { plugin_input = narrow }
    }
    """
    response = submit(api, config)
    assert response.status_code == 201, response.json()
    job = Job.objects.get(id=response.json()["jobId"])
    readers = [
        TaskGroup.objects.filter(pipeline=p, kind="READER").count()
        for p in Pipeline.objects.filter(job=job).order_by("index")
    ]
    assert readers == [3, 2]  # the source's own, then the job's
    assert job.slots_needed == (1 + 3) + (1 + 2)
    too_many = submit(api, "source { FakeSource { parallelism = 0 } }\nsink { Console { } }")
    assert too_many.status_code == 400
    assert too_many.json()["errors"][0]["path"] == "source[0].FakeSource.parallelism"


def test_jdbc_refuses_a_driver_of_another_database_than_its_url(api):
    config = """
    source { FakeSource { } }
    sink {
      jdbc {
        url = "jdbc:postgresql://127.0.0.1:5432/nowhere", user = u, password = p, table = t
        driver = "%s"
      }
    }
    """
    mysql = submit(api, config % "com.mysql.cj.jdbc.Driver")
    assert mysql.status_code == 400
    assert mysql.json()["errors"] == [
        {
            "path": "sink[0].jdbc.driver",
            "message": "com.mysql.cj.jdbc.Driver is MySQL's driver, the url is PostgreSQL's",
            "line": 4,
        }
    ]
    postgres = submit(api, config % "org.postgresql.Driver").json()["errors"]
    # The driver passes; the next check is the connection, whose user does not exist.
    assert [e["path"] for e in postgres] == ["sink[0].jdbc.url"]
    assert 'role "u" does not exist' in postgres[0]["message"]


def test_console_takes_seatunnels_print_options(caplog):
    from engine.connectors.batches import from_rows
    from engine.connectors.console import Console
    from engine.connectors.schema import Schema

    schema = Schema((("id", "bigint"),))
    plan = plan_job(
        "source { FakeSource { } }\n"
        "sink { Console { log.print.data = false } }\n"
        "sink { Console { log.print.delay.ms = 40, limit = 3 } }"
    )
    quiet, paced = plan.pipelines[0].sinks
    with caplog.at_level("INFO", logger="keel.sink.console"):
        Console(quiet.config, quiet.path).writer(schema, {}).write(from_rows([(1,), (2,)], schema))
    assert caplog.records == []  # counted, not printed

    slept: list[float] = []
    writer = Console(paced.config, paced.path).writer(schema, {})
    writer.sleep = slept.append
    with caplog.at_level("INFO", logger="keel.sink.console"):
        writer.write(from_rows([(i,) for i in range(5)], schema))
    assert [r.getMessage() for r in caplog.records] == [f"row {{'id': {i}}}" for i in range(3)]
    assert slept == [0.04, 0.04]  # between printed rows, none after the limit


def test_fakesource_shapes_its_strings_and_paces_its_reads():
    from engine.connectors.batches import to_rows
    from engine.connectors.fake import FakeSource

    plan = plan_job(
        "source { FakeSource { string.length = 8, split.read-interval = 20, row.num = 3,"
        " bytes.length = 4, schema { fields { id = bigint, name = string } } } }\n"
        "sink { Blackhole { } }"
    )
    assert plan.warnings == []
    node = plan.pipelines[0].source
    source = FakeSource(node.config, node.path)
    split = source.create_splits("BATCH")[0]
    batches = list(source.read(split, 0, "BATCH", batch_size=1))
    rows = [row for batch, _ in batches for row in to_rows(batch)]
    assert rows == [(0, "name-0xx"), (1, "name-1xx"), (2, "name-2xx")]
    # A read is due 20 ms after the last: in between the split answers "nothing yet".
    assert any(batch.num_rows == 0 for batch, _ in batches)
    short = FakeSource({**node.config, "string.length": 3}, node.path)
    batches = list(short.read(split, 0, "BATCH", batch_size=3))
    assert [r for batch, _ in batches for r in to_rows(batch)] == [
        (0, "e-0"),
        (1, "e-1"),
        (2, "e-2"),
    ]


def test_sink_options_without_effect_here_are_warned_about():
    plan = plan_job(
        "source { FakeSource { } }\n"
        'sink { LocalFile { path = "/tmp/x", is_enable_transaction = true } }'
    )
    assert [w["path"] for w in plan.warnings] == ["sink[0].LocalFile.is_enable_transaction"]


def test_a_plugins_own_seatunnel_names_are_aliases_too(tmp_path):
    (tmp_path / "in.csv").write_text("id\n1\n2\n")
    plan = plan_job(
        f'source {{ LocalFile {{ path = "{tmp_path / "in.csv"}", skip_header_row_number = 1,'
        " schema { fields { id = bigint } } } }\nsink { Console { } }"
    )
    assert plan.pipelines[0].source.config["skip_header_rows"] == 1
