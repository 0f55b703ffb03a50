"""The LocalFile sink's save modes (SeaTunnel's ``schema_save_mode`` and ``data_save_mode``):
validated with errors naming the option, with their effects on the directory, applied once per
job by the first pipeline's enumerator before its first split, and never again (a restored
attempt, a later pipeline, an attempt that is no longer current)."""

from __future__ import annotations

import threading

import pytest

from engine.connectors import filesavemodes
from engine.connectors.filesavemodes import SaveModeFailed
from engine.jobconfig import ConfigError
from engine.jobs import lifecycle
from engine.jobs.planner import plan_job
from engine.member import savemodes
from engine.member.dataplane import PluginFailure
from engine.models import Job, TaskGroup
from engine.states import TaskGroupKind
from tests.localrun import run_batch


def job(path, sink: str = "", tables: int = 0) -> str:
    """A batch job of FakeSource rows into a LocalFile sink at ``path`` (``tables`` > 0: a
    multi-table source, a pipeline per table, every one writing ``path``)."""
    fields = "fields { id = bigint }"
    source = f"row.num = 3, schema {{ {fields} }}"
    if tables:
        entries = ", ".join(
            f'{{ schema {{ table = "t{i}", {fields} }} }}' for i in range(1, tables + 1)
        )
        source = f"tables_configs = [{entries}]"
    return f"""
    env {{ job.mode = BATCH, parallelism = 2 }}
    source {{ FakeSource {{ {source} }} }}
    sink {{ LocalFile {{ path = "{path}", file_format_type = json, {sink} }} }}
    """


def errors_of(config: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        plan_job(config)
    return {e["path"]: e["message"] for e in caught.value.errors}


# -- options ---------------------------------------------------------------------------------------


def test_modes_in_any_case_are_taken_as_seatunnel_names_them(tmp_path):
    plan = plan_job(job(tmp_path, 'data_save_mode = "drop_data", schema_save_mode = Ignore'))
    config = plan.pipelines[0].sinks[0].config
    assert (config["data_save_mode"], config["schema_save_mode"]) == ("DROP_DATA", "IGNORE")


def test_a_bad_mode_is_refused_naming_the_option_and_the_choices(tmp_path):
    errors = errors_of(job(tmp_path, "data_save_mode = KEEP, schema_save_mode = MAYBE"))
    assert errors["sink[0].LocalFile.data_save_mode"] == (
        "must be one of APPEND_DATA, DROP_DATA, ERROR_WHEN_DATA_EXISTS"
    )
    assert errors["sink[0].LocalFile.schema_save_mode"].startswith(
        "must be one of CREATE_SCHEMA_WHEN_NOT_EXIST, RECREATE_SCHEMA"
    )
    custom = errors_of(job(tmp_path, "data_save_mode = CUSTOM_PROCESSING"))
    assert "custom_sql, which a file sink has not" in custom["sink[0].LocalFile.data_save_mode"]


def test_the_old_save_mode_is_validated_and_warned_about_as_without_effect(tmp_path):
    plan = plan_job(job(tmp_path, 'save_mode = "error"'))
    [warning] = [w for w in plan.warnings if w["path"].endswith("save_mode")]
    assert warning["message"].startswith("no effect: SeaTunnel's file sinks no longer read it")
    errors = errors_of(job(tmp_path, 'save_mode = "sometimes"'))
    assert (
        errors["sink[0].LocalFile.save_mode"] == "must be one of error, append, overwrite, ignore"
    )


def test_a_mode_that_deletes_is_refused_on_a_whole_file_root(settings, tmp_path):
    settings.ENGINE = {**settings.ENGINE, "connectors.file-roots": [str(tmp_path)]}
    errors = errors_of(job(tmp_path, "data_save_mode = DROP_DATA"))
    assert "save modes delete only below it" in errors["sink[0].LocalFile.path"]
    assert plan_job(job(tmp_path / "out", "data_save_mode = DROP_DATA"))  # below it: fine


# -- effects ---------------------------------------------------------------------------------------


def apply(path, **modes) -> list[str]:
    config = {"path": str(path), "schema_save_mode": "CREATE_SCHEMA_WHEN_NOT_EXIST"}
    config |= {"data_save_mode": "APPEND_DATA"} | modes
    return filesavemodes.apply(config, "sink[0].LocalFile")


def filled(path):
    (path / "k=1").mkdir(parents=True)
    (path / "k=1" / "old.json").write_text("{}\n")
    (path / "old.json").write_text("{}\n")
    return path


def test_drop_data_empties_the_directory_and_again_changes_nothing(tmp_path):
    target = filled(tmp_path / "out")
    assert apply(target, data_save_mode="DROP_DATA") == [f"emptied {target}"]
    assert target.is_dir() and not any(target.iterdir())
    apply(target, data_save_mode="DROP_DATA")  # a retry after kill -9: the same directory
    assert target.is_dir() and not any(target.iterdir())


def test_recreate_schema_deletes_the_directory_and_creates_it(tmp_path):
    target = filled(tmp_path / "out")
    assert apply(target, schema_save_mode="RECREATE_SCHEMA") == [f"recreated {target}"]
    assert target.is_dir() and not any(target.iterdir())


def test_error_when_data_exists_names_a_file_and_ignores_keel_s_staging(tmp_path):
    target = tmp_path / "out"
    (target / ".keel-tmp").mkdir(parents=True)
    (target / ".keel-tmp" / "part.attempt-1").write_text("staged")
    assert apply(target, data_save_mode="ERROR_WHEN_DATA_EXISTS") == []
    filled(target)
    with pytest.raises(SaveModeFailed) as caught:
        apply(target, data_save_mode="ERROR_WHEN_DATA_EXISTS")
    assert str(caught.value).startswith("sink[0].LocalFile.data_save_mode: ERROR_WHEN_DATA_")
    assert "old.json" in str(caught.value)


def test_error_when_schema_not_exist_and_the_default_creates_it(tmp_path):
    with pytest.raises(SaveModeFailed, match=r"ERROR_WHEN_SCHEMA_NOT_EXIST, and .* not exist"):
        apply(tmp_path / "missing", schema_save_mode="ERROR_WHEN_SCHEMA_NOT_EXIST")
    apply(tmp_path / "made")
    assert (tmp_path / "made").is_dir()


# -- once per job ----------------------------------------------------------------------------------


class Enumerator:
    """An enumerator attempt as engine.member.runtime's thread offers it to the gate: its
    ownership and the database calls are the real ones."""

    def __init__(self, group: TaskGroup) -> None:
        self.group = group
        self.task_group_id, self.attempt = group.id, group.attempt
        self.member_id = group.member_id
        self.stop = threading.Event()

    def db(self, what, call, *args, **kwargs):
        return call(*args, **kwargs)

    def still_current(self) -> bool:
        return lifecycle.owns(self.task_group_id, self.attempt, self.member_id)

    def gate(self) -> bool:
        return savemodes.before_first_split(self, self.group)


def started(engine, config: str) -> tuple[Job, list[Enumerator]]:
    engine.add_member(slots=8)
    submitted = engine.submit(config=config)
    engine.schedule()
    engine.run_deployed()
    groups = TaskGroup.objects.filter(job=submitted, kind=TaskGroupKind.ENUMERATOR)
    return submitted, [Enumerator(g) for g in groups.select_related("pipeline").order_by("id")]


@pytest.mark.django_db(transaction=True)
def test_applied_once_then_never_again_for_a_restored_attempt(engine, tmp_path):
    target = filled(tmp_path / "out")
    submitted, [enumerator] = started(engine, job(target, "data_save_mode = DROP_DATA"))
    assert enumerator.gate() is True
    assert not any(target.iterdir())
    assert Job.objects.get(id=submitted.id).save_modes_applied_at is not None
    (target / "part-of-the-job.json").write_text("{}\n")  # what its readers then publish
    assert Enumerator(enumerator.group).gate() is True  # a restored attempt starts again
    assert (target / "part-of-the-job.json").exists()


@pytest.mark.django_db(transaction=True)
def test_the_first_pipeline_applies_them_for_every_pipeline_and_the_others_wait(engine, tmp_path):
    target = filled(tmp_path / "out")
    _, (first, second) = started(engine, job(target, "data_save_mode = DROP_DATA", 2))
    assert first.group.pipeline.index < second.group.pipeline.index
    second.stop.set()  # waits until the first applied them, and applies nothing itself
    assert second.gate() is False
    assert (target / "old.json").exists()
    waiting = threading.Event()
    second.stop.clear()
    threading.Thread(target=lambda: second.gate() and waiting.set(), daemon=True).start()
    assert first.gate() is True
    assert waiting.wait(10), "the second pipeline's enumerator went on once they were applied"
    assert not any(target.iterdir())


@pytest.mark.django_db(transaction=True)
def test_an_attempt_no_longer_current_applies_nothing(engine, tmp_path):
    target = filled(tmp_path / "out")
    _, [enumerator] = started(engine, job(target, "data_save_mode = DROP_DATA"))
    enumerator.attempt -= 1  # the master has moved on to a newer attempt
    assert enumerator.gate() is False
    assert (target / "old.json").exists()


@pytest.mark.django_db(transaction=True)
def test_a_failed_check_fails_the_enumerator_naming_the_sink_and_is_not_recorded(engine, tmp_path):
    target = filled(tmp_path / "out")
    submitted, [enumerator] = started(
        engine, job(target, "data_save_mode = ERROR_WHEN_DATA_EXISTS")
    )
    with pytest.raises(PluginFailure, match=r"^sink\[0\]\.LocalFile: SaveModeFailed: "):
        enumerator.gate()
    assert Job.objects.get(id=submitted.id).save_modes_applied_at is None


@pytest.mark.django_db(transaction=True)
def test_default_modes_record_and_change_nothing(engine, tmp_path):
    target = filled(tmp_path / "out")
    submitted, [enumerator] = started(engine, job(target))
    assert enumerator.gate() is True
    assert (target / "old.json").exists()
    assert Job.objects.get(id=submitted.id).save_modes_applied_at is None


def test_a_job_dropping_its_directory_leaves_only_its_own_rows(tmp_path):
    target = filled(tmp_path / "out")
    run_batch(job(target, 'data_save_mode = "drop_data"'))
    assert not (target / "old.json").exists()
    assert sum(len(p.read_text().splitlines()) for p in target.glob("*.jsonl")) == 2 * 3
