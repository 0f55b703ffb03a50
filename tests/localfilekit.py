"""A LocalFile source over a test's directory, as a planned job configures it: what the Lane A
LocalFile reader tests read their files with."""

from __future__ import annotations

from pathlib import Path

from engine.connectors.localfile import LocalFileSource
from engine.jobs.planner import plan_job


def source_in(
    directory: Path, options: str = "", fields: str = "id = int, name = string"
) -> LocalFileSource:
    """The source reading ``directory``'s files of ``fields``, with ``options`` (each followed
    by a comma) among its settings."""
    plan = plan_job(
        f'source {{ LocalFile {{ path = "{directory}", {options} '
        f"schema {{ fields {{ {fields} }} }} }} }}\nsink {{ Blackhole {{}} }}"
    )
    node = plan.pipelines[0].source
    return LocalFileSource(node.config, node.path)
