"""``file.discovery.max-file-age`` is a LocalFile option: at least 1 ms, and, like
``file.discovery.interval``, without effect in Lane B, which planning says."""

from __future__ import annotations

import pytest

from engine.jobconfig import ConfigError
from engine.jobs.planner import plan_job


def config(directory, options: str) -> str:
    return (
        "env { job.mode = STREAMING }\n"
        f'source {{ LocalFile {{ path = "{directory}", {options}\n'
        "  schema { fields { id = int } } } }\nsink { Blackhole {} }"
    )


def test_lane_b_warns_that_both_discovery_options_have_no_effect(tmp_path, settings):
    settings.ENGINE = {**settings.ENGINE, "source-runtime.managed-connectors": []}
    plan = plan_job(
        config(tmp_path, "file.discovery.interval = 100, file.discovery.max-file-age = 5000")
    )
    warned = {w["path"]: w["message"] for w in plan.warnings}
    for option in ("file.discovery.interval", "file.discovery.max-file-age"):
        assert warned[f"source[0].LocalFile.{option}"].startswith("no effect: the source runs")


def test_max_file_age_is_at_least_one_ms(tmp_path):
    with pytest.raises(ConfigError, match="max-file-age"):
        plan_job(config(tmp_path, "file.discovery.interval = 100, file.discovery.max-file-age = 0"))
