"""The job's ``env`` block: its options, SeaTunnel's other spellings of them, and its checks.

Every key SeaTunnel accepts in ``env`` is accepted here: with its effect, under its new name
(the Flink starter's older ``execution.*`` spellings of a common option), or with a warning
saying why it does nothing in Keel. Only a key no engine knows is an error.
"""

from __future__ import annotations

import difflib
from typing import Any

from engine.connectors.base import Option
from engine.states import JobMode

ENV_OPTIONS = (
    Option("job.name", str, default=None),
    Option("job.mode", str, default=JobMode.BATCH.value, choices=tuple(JobMode.values)),
    Option("parallelism", int, default=1, min=1),
    Option("checkpoint.interval", int, default=None, min=0, help="ms; 0 disables"),
    Option("checkpoint.timeout", int, default=60000, min=1),
    Option("checkpoint.max-retained", int, default=3, min=1),
    Option("job.retry.times", int, default=3, min=0),
    Option("job.retry.interval.seconds", int, default=3, min=0),
    Option("job.dirty-task.threshold", int, default=-1),
)
#: Env options that SeaTunnel documents and that have no effect here: accepted, with a warning
#: that says why. Options of other engines (``spark.*``, ``flink.*``) likewise.
IGNORED_ENV_OPTIONS = {
    "jars": "Keel's plugins are built in; no jars are loaded",
    "shade.identifier": "Keel stores no shaded secrets in configs (use a named connection)",
    "savemode.execute.location": "Keel's sinks apply their save mode where they run",
    "read_limit.rows_per_second": "use the source's own rate options",
    "read_limit.bytes_per_second": "use the source's own rate options",
    "min-pause": "Keel runs one checkpoint of a pipeline at a time, the next one "
    "checkpoint.interval after the previous one began",
    "pipeline_concurrency": "Keel deploys all of a job's pipelines at once",
}
#: Map-valued SeaTunnel options without effect here: their keys arrive flattened
#: (``custom_parameters.x``), and one warning covers the whole block.
IGNORED_ENV_BLOCKS = {
    "custom_parameters": "free-form engine parameters, which no part of Keel reads",
}
FOREIGN_ENV_PREFIXES = ("spark.", "flink.")
#: The Flink starter's older (deprecated) spellings of common options: used under the common
#: name unless that is set too, which wins, as in the starter. Other ``execution.*`` keys are
#: Flink's own and are warned about like ``flink.*``.
LEGACY_ENV_NAMES = {
    "execution.parallelism": "parallelism",
    "execution.checkpoint.interval": "checkpoint.interval",
    "execution.checkpoint.timeout": "checkpoint.timeout",
}
LEGACY_FLINK_PREFIX = "execution."
#: ``tag_filter { key = value }``: run the job only on workers whose tags hold every pair.
TAG_FILTER = "tag_filter"
STREAMING_CHECKPOINT_INTERVAL = 10000
MAX_PARALLELISM = 256


def validate_env(env: dict[str, Any]) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """(the env with defaults, errors, warnings). SeaTunnel's options without effect here and
    other engines' options are warned about; anything else unknown is an error, with the
    nearest known name when it looks like a typo."""
    errors: list[dict] = []
    warnings: list[dict] = []
    env, spelled = _renamed(env, warnings)
    known = {o.name for o in ENV_OPTIONS}
    blocks_warned: set[str] = set()
    for key in env:
        if key in known or key == TAG_FILTER or key.startswith(f"{TAG_FILTER}."):
            continue
        path = f"env.{key}"
        block = next((b for b in IGNORED_ENV_BLOCKS if key.split(".", 1)[0] == b), None)
        if block is not None:
            if block not in blocks_warned:
                blocks_warned.add(block)
                message = f"no effect: {IGNORED_ENV_BLOCKS[block]}"
                warnings.append({"path": f"env.{block}", "message": message})
        elif key in IGNORED_ENV_OPTIONS:
            warnings.append({"path": path, "message": f"no effect: {IGNORED_ENV_OPTIONS[key]}"})
        elif key.startswith(FOREIGN_ENV_PREFIXES):
            engine = key.split(".", 1)[0].capitalize()
            warnings.append({"path": path, "message": f"ignored: an option of {engine}"})
        elif key.startswith(LEGACY_FLINK_PREFIX):
            message = "ignored: an option of Flink (the Flink starter's older spelling)"
            warnings.append({"path": path, "message": message})
        else:
            names = known | set(IGNORED_ENV_OPTIONS) | {TAG_FILTER}
            near = difflib.get_close_matches(key, sorted(names), n=1)
            hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(sorted(known))}"
            errors.append({"path": path, "message": f"unknown env option ({hint})"})
    out: dict[str, Any] = {}
    for option in ENV_OPTIONS:
        if option.name not in env or env[option.name] is None:
            out[option.name] = option.default
            continue
        try:
            out[option.name] = option.coerce(env[option.name])
        except ValueError as exc:
            path = f"env.{spelled.get(option.name, option.name)}"
            errors.append({"path": path, "message": str(exc)})
    tags = tag_filter(env, errors)
    if tags:
        out[TAG_FILTER] = tags
    if out.get("parallelism") and out["parallelism"] > MAX_PARALLELISM:
        path = f"env.{spelled.get('parallelism', 'parallelism')}"
        errors.append({"path": path, "message": f"must be at most {MAX_PARALLELISM}"})
    if not errors and out["checkpoint.interval"] is None and out["job.mode"] == JobMode.STREAMING:
        out["checkpoint.interval"] = STREAMING_CHECKPOINT_INTERVAL
    return out, errors, warnings


def _renamed(env: dict[str, Any], warnings: list[dict]) -> tuple[dict[str, Any], dict[str, str]]:
    """The env with each older spelling under its common name, unless the common name is set
    too (then the common one wins and the older one is ignored, as SeaTunnel's Flink starter
    does); each older spelling met gets a warning saying which. Also {common name: the older
    spelling it came from}, for errors to name the key the user wrote."""
    out = dict(env)
    spelled: dict[str, str] = {}
    for old, new in LEGACY_ENV_NAMES.items():
        if old not in env:
            continue
        value = out.pop(old)
        if new in env:
            message = f"ignored: {new} is set too and takes precedence (as in SeaTunnel)"
        else:
            out[new] = value
            spelled[new] = old
            message = f"used as {new}: its older spelling (SeaTunnel's Flink starter)"
        warnings.append({"path": f"env.{old}", "message": message})
    return out, spelled


def tag_filter(env: dict[str, Any], errors: list[dict]) -> dict[str, str]:
    """``tag_filter``'s pairs as strings (SeaTunnel compares tags as strings), from the flattened
    env: ``{"tag_filter.group": "platform"}`` -> ``{"group": "platform"}``."""
    whole = env.get(TAG_FILTER)
    if whole is not None and whole != {}:
        errors.append({"path": f"env.{TAG_FILTER}", "message": "must be an object of tags"})
        return {}
    tags: dict[str, str] = {}
    prefix = f"{TAG_FILTER}."
    for key, value in env.items():
        if not key.startswith(prefix):
            continue
        if isinstance(value, list | dict) or value is None:
            errors.append({"path": f"env.{key}", "message": "must be a string"})
        elif isinstance(value, bool):
            tags[key[len(prefix) :]] = str(value).lower()
        else:
            tags[key[len(prefix) :]] = str(value)
    return tags


def describe_tags(tags: dict[str, str]) -> str:
    """``{group: platform, team: team1}``: a tag set as messages show it."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(tags.items())) + "}"
