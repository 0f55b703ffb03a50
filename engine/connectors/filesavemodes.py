"""SeaTunnel's save modes for the LocalFile sink: what happens to the target directory once per
job, before its first row (engine.member.savemodes decides when; this module says what).

As SeaTunnel's file catalog does: ``schema_save_mode`` treats the directory as the table
(RECREATE_SCHEMA deletes and creates it, CREATE_SCHEMA_WHEN_NOT_EXIST creates it,
ERROR_WHEN_SCHEMA_NOT_EXIST fails without it, IGNORE does nothing), then ``data_save_mode`` its
files (DROP_DATA empties it, ERROR_WHEN_DATA_EXISTS fails when it holds a file, APPEND_DATA adds
beside them). Every effect is idempotent: applied again before any row of the job is written, it
leaves the same directory, so a retry after kill -9 is safe.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from engine.connectors.base import Option
from engine.connectors.boundaries import file_roots, resolve_file_path
from engine.connectors.localfile_options import TMP_DIR

SCHEMA_MODES = (
    "CREATE_SCHEMA_WHEN_NOT_EXIST",
    "RECREATE_SCHEMA",
    "ERROR_WHEN_SCHEMA_NOT_EXIST",
    "IGNORE",
)
#: SeaTunnel's file sinks take these three (CUSTOM_PROCESSING runs SQL, which files have not).
DATA_MODES = ("APPEND_DATA", "DROP_DATA", "ERROR_WHEN_DATA_EXISTS")
#: The file sinks' first option (SeaTunnel 2.1): read by none of its sinks since 2.3.
OLD_MODES = ("error", "append", "overwrite", "ignore")
#: The modes that change or check the directory before the job's first row.
EFFECTS = {"RECREATE_SCHEMA", "ERROR_WHEN_SCHEMA_NOT_EXIST", "DROP_DATA", "ERROR_WHEN_DATA_EXISTS"}

OPTIONS = (
    Option(
        "schema_save_mode",
        str,
        default="CREATE_SCHEMA_WHEN_NOT_EXIST",
        help="the directory before the job's first row: " + ", ".join(SCHEMA_MODES),
    ),
    Option(
        "data_save_mode",
        str,
        default="APPEND_DATA",
        help="its files before the job's first row: " + ", ".join(DATA_MODES),
    ),
    Option("save_mode", str, help="SeaTunnel 2.1's option: no effect, as in SeaTunnel"),
)


class SaveModeFailed(Exception):
    """A save mode's check failed (a directory missing, or holding files): the job fails."""


def check(config: dict) -> list[tuple[str, str]]:
    """The save-mode options, in any case, as SeaTunnel's names (in ``config``); errors name
    the option."""
    errors = []
    for option, allowed in (("schema_save_mode", SCHEMA_MODES), ("data_save_mode", DATA_MODES)):
        value = str(config.get(option) or "").strip().upper()
        if value in allowed:
            config[option] = value
        elif value == "CUSTOM_PROCESSING":
            errors.append((option, "CUSTOM_PROCESSING runs custom_sql, which a file sink has not"))
        else:
            errors.append((option, f"must be one of {', '.join(allowed)}"))
    old = config.get("save_mode")
    if old is not None and str(old).strip().lower() not in OLD_MODES:
        errors.append(("save_mode", f"must be one of {', '.join(OLD_MODES)}"))
    if not errors and destroys(config):
        errors += _root_errors(Path(config["path"]))
    return errors


def warnings(config: dict) -> list[tuple[str, str]]:
    """[(option, why)] for the accepted options that change nothing."""
    if config.get("save_mode") is None:
        return []
    return [
        (
            "save_mode",
            "no effect: SeaTunnel's file sinks no longer read it (schema_save_mode and "
            "data_save_mode replaced it)",
        )
    ]


def destroys(config: dict) -> bool:
    return (
        config.get("schema_save_mode") == "RECREATE_SCHEMA"
        or config.get("data_save_mode") == "DROP_DATA"
    )


def due(config: dict) -> bool:
    """Whether the sink has anything to do or check before the job's first row (the default
    modes have not: the writers create the directory themselves)."""
    return bool(EFFECTS & {config.get("schema_save_mode"), config.get("data_save_mode")})


def _root_errors(path: Path) -> list[tuple[str, str]]:
    """A save mode never deletes a whole file root (nor a directory holding one)."""
    for root in file_roots():
        if root == path or root.is_relative_to(path):
            return [("path", f"{path} holds the file root {root}: save modes delete only below it")]
    return []


def apply(config: dict, label: str) -> list[str]:
    """Apply the sink's save modes to its directory (re-resolved inside the file roots);
    SaveModeFailed names ``label`` and the option whose check failed. Returns what was done."""
    path = resolve_file_path(config["path"])
    if destroys(config) and _root_errors(path):
        raise SaveModeFailed(f"{label}.path: {_root_errors(path)[0][1]}")
    done = []
    schema = config.get("schema_save_mode")
    if schema == "RECREATE_SCHEMA":
        _delete(path)
        done.append(f"recreated {path}")
    elif schema == "ERROR_WHEN_SCHEMA_NOT_EXIST" and not path.is_dir():
        raise SaveModeFailed(
            f"{label}.schema_save_mode: ERROR_WHEN_SCHEMA_NOT_EXIST, and {path} does not exist"
        )
    data = config.get("data_save_mode")
    if data == "DROP_DATA" and schema != "RECREATE_SCHEMA":
        _delete(path)
        done.append(f"emptied {path}")
    elif data == "ERROR_WHEN_DATA_EXISTS":
        found = first_file(path)
        if found is not None:
            raise SaveModeFailed(
                f"{label}.data_save_mode: ERROR_WHEN_DATA_EXISTS, and {path} holds {found}"
            )
    if schema != "IGNORE":
        path.mkdir(parents=True, exist_ok=True)
    return done


def first_file(path: Path) -> Path | None:
    """A file under ``path`` (partition directories included), Keel's staging left out."""
    if not path.is_dir():
        return None
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not (Path(root) == path and d == TMP_DIR))
        if names:
            return Path(root) / sorted(names)[0]
    return None


def _delete(path: Path) -> None:
    """Delete ``path`` and what it holds; a second deleter racing this one is no error."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=_gone_is_fine)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _gone_is_fine(function, name: str, info: tuple) -> None:
    if not isinstance(info[1], FileNotFoundError):
        raise info[1]
