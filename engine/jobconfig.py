"""Job configs: SeaTunnel-style HOCON (or JSON) into plugin blocks, with errors that name a path.

Two HOCON behaviours are wrong for job configs and handled here:
- duplicate keys merge: ``source { FakeSource {..} FakeSource {..} }`` would be one source. Before
  pyhocon parses, a small lexer renames each plugin block key inside ``source``, ``transform``
  and ``sink`` to a unique ``__keel_<index>_<Name>`` (same line, so error lines stay right);
- dotted keys nest: ``row.num = 5`` is ``{row: {num: 5}}``. Options are looked up by dotted name
  in either form, and unknown-option checks walk leaf paths (see ``flatten_options``).
SeaTunnel's JSON form, ``"source": [{"plugin_name": "FakeSource", ...}]``, is accepted too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from engine import hocon

SECTIONS = ("source", "transform", "sink")
_RENAMED = re.compile(r"^__keel_(\d+)_(.+)$")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


#: Bounds on one config beyond its size and depth (engine.config.*): plugin blocks, variables.
MAX_PLUGIN_BLOCKS = 64
MAX_VARIABLES = 100
MAX_VARIABLE_LENGTH = 4096


class ConfigError(Exception):
    """A job config is invalid; ``errors`` is ``[{path, message}]`` (and ``line`` if known)."""

    def __init__(self, errors: list[dict]) -> None:
        super().__init__("; ".join(_format(e) for e in errors))
        self.errors = errors


def _format(error: dict) -> str:
    where = error.get("path") or "config"
    if error.get("line"):
        where += f" (line {error['line']})"
    return f"{where}: {error['message']}"


@dataclass
class PluginBlock:
    section: str  # source | transform | sink
    index: int  # position within its section
    name: str  # plugin name, e.g. FakeSource
    options: dict[str, Any]  # the block's tree, plain Python values
    line: int | None = None

    @property
    def path(self) -> str:
        return f"{self.section}[{self.index}].{self.name}"


@dataclass
class ParsedJob:
    env: dict[str, Any]
    blocks: dict[str, list[PluginBlock]] = field(default_factory=dict)

    def section(self, name: str) -> list[PluginBlock]:
        return self.blocks.get(name, [])


# -- the lexer that keeps duplicate plugin blocks apart -------------------------------------------


def _skip_comment(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _skip_space(text: str, i: int) -> int:
    while i < len(text):
        ch = text[i]
        if ch in " \t\r\n,":
            i += 1
        elif ch == "#" or text.startswith("//", i):
            i = _skip_comment(text, i)
        else:
            break
    return i


def _read_key(text: str, i: int) -> tuple[str, int] | None:
    """A key token at text[i] (bare identifier or quoted string): (key, end) or None."""
    if i < len(text) and text[i] == '"' and not text.startswith('"""', i):
        end = hocon.skip_string(text, i)
        return text[i + 1 : end - 1], end
    match = _IDENT.match(text, i)
    if match:
        return match.group(0), match.end()
    return None


def _opens_object(text: str, i: int) -> int | None:
    """If ``[=|:] {`` follows at i (spaces allowed), the index of the brace."""
    j = i
    while j < len(text) and text[j] in " \t":
        j += 1
    if j < len(text) and text[j] in "=:":
        j += 1
        while j < len(text) and text[j] in " \t\r\n":
            j += 1
    return j if j < len(text) and text[j] == "{" else None


def _matching_brace(text: str, i: int) -> int:
    """Index of the brace closing the one at text[i] (strings and comments skipped)."""
    depth = 0
    j = i
    while j < len(text):
        ch = text[j]
        if ch == '"':
            j = hocon.skip_string(text, j)
            continue
        if ch == "#" or text.startswith("//", j):
            j = _skip_comment(text, j)
            continue
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return len(text)


def _rename_plugin_blocks(text: str) -> tuple[str, dict[tuple[str, int], int]]:
    """Rename each plugin block key of the top-level sections; return (text, block lines)."""
    edits: list[tuple[int, int, str]] = []
    lines: dict[tuple[str, int], int] = {}
    counters: dict[str, int] = {}
    i = _skip_space(text, 0)
    root = 0
    if i < len(text) and text[i] == "{":
        # The whole config in braces (valid HOCON, and how JSON looks): its keys are top level.
        root = 1
        i += 1
    depth = root
    while i < len(text):
        i = _skip_space(text, i)
        if i >= len(text):
            break
        ch = text[i]
        if ch == '"' and depth > root:
            i = hocon.skip_string(text, i)
            continue
        if depth == root:
            key = _read_key(text, i)
            if key is not None:
                name, end = key
                brace = _opens_object(text, end)
                if name in SECTIONS and brace is not None:
                    close = _matching_brace(text, brace)
                    _rename_in_section(text, name, brace + 1, close, edits, lines, counters)
                    i = close + 1
                    continue
                i = end
                continue
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth = max(depth - 1, 0)
        elif ch == '"':
            i = hocon.skip_string(text, i)
            continue
        i += 1
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text, lines


def _rename_in_section(
    text: str,
    section: str,
    start: int,
    stop: int,
    edits: list[tuple[int, int, str]],
    lines: dict,
    counters: dict[str, int],
) -> None:
    """Rename the plugin keys of one ``section { ... }`` occurrence. Indexes continue across
    occurrences (``sink {..} sink {..}`` merge in HOCON; their plugins must not)."""
    index = counters.get(section, 0)
    i = start
    while i < stop:
        i = _skip_space(text, i)
        if i >= stop:
            return
        key = _read_key(text, i)
        if key is None:
            # Not a key: skip a value or stray token.
            if text[i] in "{[":
                i = _matching_brace(text, i) + 1
            elif text[i] == '"':
                i = hocon.skip_string(text, i)
            else:
                i += 1
            continue
        name, end = key
        brace = _opens_object(text, end)
        if brace is None:
            i = end
            continue
        edits.append((i, end, f"__keel_{index}_{name}"))
        lines[(section, index)] = text.count("\n", 0, i) + 1
        index += 1
        counters[section] = index
        i = _matching_brace(text, brace) + 1


# -- parsing --------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """pyhocon trees into plain dicts/lists; quoted keys lose their quotes."""
    from pyhocon import ConfigTree

    if isinstance(value, ConfigTree | dict):
        return {_unquote(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _unquote(key: str) -> str:
    return key[1:-1] if len(key) >= 2 and key[0] == key[-1] == '"' else key


def flatten_options(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Leaf paths of a tree as dotted keys: ``{row: {num: 5}}`` -> ``{"row.num": 5}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            out.update(flatten_options(value, path))
        else:
            out[path] = value
    return out


_MISSING = object()


def _find(tree: dict[str, Any], dotted: str) -> Any:
    if dotted in tree:
        return tree[dotted]
    head, _, rest = dotted.partition(".")
    while rest:
        node = tree.get(head)
        if isinstance(node, dict):
            found = _find(node, rest)
            if found is not _MISSING:
                return found
        more, _, rest = rest.partition(".")
        head = f"{head}.{more}"
    return _MISSING


def lookup(tree: dict[str, Any], dotted: str, default: Any = _MISSING) -> Any:
    """An option by dotted name, written either as a quoted key or as nesting."""
    found = _find(tree, dotted)
    if found is _MISSING:
        if default is _MISSING:
            raise KeyError(dotted)
        return default
    return found


def limits() -> hocon.Limits:
    from django.conf import settings

    return hocon.Limits(
        max_bytes=settings.ENGINE["config.max-bytes"],
        max_depth=settings.ENGINE["config.max-depth"],
    )


def check_variables(values: Any) -> dict[str, str]:
    """The variables passed with a submission: ``{name: text}`` (ConfigError naming the bad one)."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError([{"path": "variables", "message": "must be an object of name: value"}])
    errors = []
    out: dict[str, str] = {}
    if len(values) > MAX_VARIABLES:
        errors.append(
            {"path": "variables", "message": f"at most {MAX_VARIABLES} variables are allowed"}
        )
    for name, value in values.items():
        if not isinstance(name, str) or not hocon.VARIABLE_NAME.match(name):
            errors.append(
                {
                    "path": f"variables.{name}",
                    "message": "a variable name is letters, digits, '_', '.' or '-', "
                    "starting with a letter or '_'",
                }
            )
        elif name in hocon.TABLE_PLACEHOLDERS:
            errors.append(
                {
                    "path": f"variables.{name}",
                    "message": "is a table placeholder, filled per table: it cannot be a variable",
                }
            )
        elif isinstance(value, bool) or not isinstance(value, str | int | float):
            errors.append({"path": f"variables.{name}", "message": "must be a string or number"})
        elif len(str(value)) > MAX_VARIABLE_LENGTH:
            errors.append(
                {
                    "path": f"variables.{name}",
                    "message": f"is longer than {MAX_VARIABLE_LENGTH} characters",
                }
            )
        else:
            out[name] = str(value)
    if errors:
        raise ConfigError(errors)
    return out


def parse_job_config(text: str, variables: dict[str, str] | None = None) -> ParsedJob:
    """Parse a job config; raise ConfigError (path, message, line) for anything malformed.

    Substitutions resolve inside the config, then from ``variables``; never from the process's
    environment. Includes are refused, and size and nesting are bounded (engine.hocon)."""
    import pyparsing
    from pyhocon import ConfigFactory
    from pyhocon.exceptions import ConfigException, ConfigSubstitutionException

    if not isinstance(text, str) or not text.strip():
        raise ConfigError([{"path": "config", "message": "the job config is empty"}])
    refusal = hocon.scan(text, limits())
    if refusal is not None:
        error: dict[str, Any] = {"path": "config", "message": refusal.message}
        if refusal.line:
            error.update(line=refusal.line, column=refusal.column)
        raise ConfigError([error])
    renamed, lines = _rename_plugin_blocks(text)
    try:
        with hocon.variables(variables):
            tree = ConfigFactory.parse_string(renamed)
    except pyparsing.ParseBaseException as exc:
        line, column = hocon.position(renamed, exc.loc)
        raise ConfigError(
            [
                {
                    "path": "config",
                    "line": line,
                    "column": column,
                    "message": f"syntax error at line {line}, column {column}: unexpected "
                    f"{hocon.describe_at(renamed, exc.loc)}",
                }
            ]
        ) from None
    except ConfigSubstitutionException as exc:
        raise ConfigError([_substitution_error(str(exc))]) from None
    except ConfigException as exc:
        found = re.search(r"line: ?(\d+)", str(exc))
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid config"
        raise ConfigError(
            [
                {
                    "path": "config",
                    "line": int(found.group(1)) if found else None,
                    "message": message[:200],
                }
            ]
        ) from None
    except RecursionError:
        raise ConfigError([{"path": "config", "message": "the config nests too deeply"}]) from None
    except (AttributeError, TypeError, KeyError, IndexError):
        # pyhocon's own failures on shapes it does not expect (a top-level list with a
        # substitution in it, ``[${a}]``): the config is not an object of blocks.
        raise ConfigError([{"path": "config", "message": "the config must be an object"}]) from None
    root = hocon.fill_strings(_plain(tree), variables or {})
    if not isinstance(root, dict):
        raise ConfigError([{"path": "config", "message": "the config must be an object"}])
    errors: list[dict] = []
    env = root.get("env", {})
    if not isinstance(env, dict):
        errors.append({"path": "env", "message": "must be an object"})
        env = {}
    unknown = sorted(set(root) - {"env", *SECTIONS})
    for key in unknown:
        errors.append(
            {
                "path": key,
                "message": "unknown top-level block (expected env, source, transform, sink)",
            }
        )
    job = ParsedJob(env=flatten_options(env))
    for section in SECTIONS:
        job.blocks[section] = _section_blocks(section, root.get(section), lines, errors)
    blocks = sum(len(b) for b in job.blocks.values())
    if blocks > MAX_PLUGIN_BLOCKS:
        raise ConfigError(
            [
                {
                    "path": "config",
                    "message": f"the config has {blocks} plugin blocks, over the limit of "
                    f"{MAX_PLUGIN_BLOCKS}",
                }
            ]
        )
    if not job.blocks["source"] and not any(e["path"].startswith("source") for e in errors):
        errors.append({"path": "source", "message": "at least one source is required"})
    if not job.blocks["sink"] and not any(e["path"].startswith("sink") for e in errors):
        errors.append({"path": "sink", "message": "at least one sink is required"})
    if errors:
        raise ConfigError(errors)
    return job


def _section_blocks(section: str, value: Any, lines: dict, errors: list[dict]) -> list[PluginBlock]:
    if value is None:
        return []
    blocks: list[PluginBlock] = []
    if isinstance(value, list):  # SeaTunnel's JSON form
        for index, item in enumerate(value):
            if not isinstance(item, dict) or not isinstance(item.get("plugin_name"), str):
                errors.append(
                    {
                        "path": f"{section}[{index}]",
                        "message": "must be an object with a plugin_name",
                    }
                )
                continue
            options = {k: v for k, v in item.items() if k != "plugin_name"}
            blocks.append(PluginBlock(section, index, item["plugin_name"], options))
        return blocks
    if not isinstance(value, dict):
        errors.append({"path": section, "message": "must be an object of plugin blocks"})
        return []
    for key, options in value.items():
        match = _RENAMED.match(key)
        if not match or not isinstance(options, dict):
            errors.append(
                {
                    "path": f"{section}.{key}",
                    "message": "expected a plugin block such as FakeSource { ... }",
                }
            )
            continue
        index, name = int(match.group(1)), match.group(2)
        blocks.append(PluginBlock(section, index, name, options, lines.get((section, index))))
    blocks.sort(key=lambda b: b.index)
    return blocks


def _substitution_error(text: str) -> dict:
    """pyhocon's unresolved substitution, said for a job's author."""
    found = re.search(r"\$\{([^}]*)\}.*?line: ?(\d+), col: ?(\d+)", text)
    if not found:
        return {"path": "config", "message": text.strip().splitlines()[0][:200]}
    name, line, column = found.group(1), int(found.group(2)), int(found.group(3))
    return {
        "path": "config",
        "line": line,
        "column": column,
        "message": f"unknown variable ${{{name}}} at line {line}: define {name} in the config, "
        f'or pass it with the submission (variables {{"{name}": ...}}, or -i {name}=...)',
    }
