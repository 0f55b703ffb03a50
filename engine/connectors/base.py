"""Plugin option specs and validation shared by every connector and transform.

A plugin declares its options; ``validate_block`` checks a parsed block against them and returns
the typed config or errors whose paths name the block and key (``sink[0].Jdbc.url``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from engine.jobconfig import PluginBlock, flatten_options, lookup

_MISSING = object()


@dataclass(frozen=True)
class Option:
    name: str  # dotted, e.g. "row.num"
    type: type  # int, float, str, bool, list or dict
    required: bool = False
    default: Any = None
    choices: tuple = ()
    min: float | None = None
    help: str = ""

    def coerce(self, value: Any) -> Any:
        """The value as this option's type; raise ValueError with a message for the user."""
        expected = self.type
        if expected is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise ValueError("must be true or false")
        if expected is int:
            if isinstance(value, bool):
                raise ValueError("must be an integer")
            if isinstance(value, int):
                result = value
            elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
                result = int(value)
            else:
                raise ValueError("must be an integer")
        elif expected is float:
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ValueError("must be a number")
            try:
                result = float(value)
            except ValueError:
                raise ValueError("must be a number") from None
        elif expected is str:
            if isinstance(value, dict | list) or value is None:
                raise ValueError("must be a string")
            result = str(value)
        elif expected is list:
            if not isinstance(value, list):
                raise ValueError("must be a list")
            result = value
        elif expected is dict:
            if not isinstance(value, dict):
                raise ValueError("must be an object")
            result = value
        else:  # pragma: no cover - a spec error, not user input
            raise TypeError(expected)
        if self.choices and result not in self.choices:
            raise ValueError(f"must be one of {', '.join(map(str, self.choices))}")
        if self.min is not None and result < self.min:
            raise ValueError(f"must be at least {self.min:g}")
        return result


class Plugin:
    """A source, transform or sink: a name, a section, options; runtime methods per kind."""

    name: ClassVar[str]
    section: ClassVar[str]  # source | transform | sink
    options: ClassVar[tuple[Option, ...]] = ()
    #: Its checks open network connections: a job using it is planned in a worker.
    connects: ClassVar[bool] = False
    #: SeaTunnel's options that have no effect here, with why: accepted, with a warning.
    ignored_options: ClassVar[dict[str, str]] = {}
    #: SeaTunnel's names of its own options: {their name: Keel's}.
    aliases: ClassVar[dict[str, str]] = {}

    def __init__(self, config: dict[str, Any], path: str) -> None:
        self.config = config
        self.path = path

    @classmethod
    def all_options(cls) -> tuple[Option, ...]:
        common: tuple[Option, ...] = ()
        if cls.section in ("source", "transform"):
            common += (Option("plugin_output", str, help="name of the stream this produces"),)
        if cls.section == "source":
            common += (
                Option("parallelism", int, min=1, help="readers of this source (else the job's)"),
            )
        if cls.section in ("transform", "sink"):
            common += (
                Option("plugin_input", list, help="names of the streams this consumes"),
                Option("parallelism", int, min=1, help="no effect: it runs in each reader"),
            )
        return common + cls.options

    @classmethod
    def check(cls, config: dict[str, Any]) -> list[tuple[str, str]]:
        """Cross-option checks: [(option name, message)]."""
        return []

    @classmethod
    def notes(cls, config: dict[str, Any]) -> list[tuple[str, str]]:
        """Warnings about a valid config, [(option name, message)]: what it asks for that has
        no effect here (a URL parameter of another driver)."""
        return []


#: SeaTunnel's older names of the common options, which most of its configs still use.
ALIASES = {"result_table_name": "plugin_output", "source_table_name": "plugin_input"}


def _unalias(plugin: type[Plugin], block: PluginBlock) -> tuple[dict[str, Any], list[dict]]:
    """The block's options with each alias under its Keel name (a one-name list, as SeaTunnel
    allows for a stream's name, is that name); both names with different values is an error
    naming the alias."""
    options = dict(block.options)
    errors: list[dict] = []
    known = {o.name for o in plugin.all_options()}
    for alias, name in (ALIASES | plugin.aliases).items():
        if alias not in options or name not in known:
            continue
        value = options.pop(alias)
        if name == "plugin_output" and isinstance(value, list) and len(value) == 1:
            value = value[0]
        if name == "plugin_output" and isinstance(value, list):
            errors.append(_error(block, alias, "a plugin makes one stream: name one"))
        elif name in options and _streams(options[name]) != _streams(value):
            errors.append(_error(block, alias, f"says {value!r} but {name} says {options[name]!r}"))
        else:
            options[name] = value
    # SeaTunnel's JSON form writes a stream as a list of one; several inputs may be a list or
    # a comma-separated string.
    if isinstance(options.get("plugin_output"), list) and len(options["plugin_output"]) == 1:
        options["plugin_output"] = options["plugin_output"][0]
    if options.get("plugin_input") is not None and "plugin_input" in known:
        options["plugin_input"] = _streams(options["plugin_input"])
    return options, errors


def _streams(value: Any) -> Any:
    """Stream names as a list: ``a``, ``"a, b"`` and ``[a, b]`` alike."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def validate_block(
    plugin: type[Plugin], block: PluginBlock, check: bool = True
) -> tuple[dict | None, list[dict], list[dict]]:
    """Validate a block's options against ``plugin``: (config, errors, warnings). With
    ``check`` false, the plugin's own cross-option checks are left to the caller (a block
    whose options name the table they are planned for)."""
    options, errors = _unalias(plugin, block)
    warnings: list[dict] = []
    block = replace(block, options=options)
    config: dict[str, Any] = {}
    specs = plugin.all_options()
    for option in specs:
        value = lookup(block.options, option.name, _MISSING)
        if value is _MISSING:
            if option.required:
                errors.append(_error(block, option.name, "is required"))
            config[option.name] = option.default
            continue
        try:
            config[option.name] = option.coerce(value)
        except ValueError as exc:
            errors.append(_error(block, option.name, str(exc) + _unfilled(value)))
    object_options = [o.name for o in specs if o.type is dict]
    known = {o.name for o in specs}
    for leaf in flatten_options(block.options):
        if leaf in known or any(leaf.startswith(f"{name}.") for name in object_options):
            continue
        if any(name.startswith(f"{leaf}.") for name in known):
            continue  # a dotted option written as an (empty) object
        ignored = _ignored(plugin, leaf)
        if ignored is not None:
            why = plugin.ignored_options[ignored]
            warnings.append({"path": f"{block.path}.{leaf}", "message": f"no effect: {why}"})
            continue
        errors.append(_error(block, leaf, f"unknown option for {plugin.name}"))
    if not errors and check:
        errors += [_error(block, name, message) for name, message in plugin.check(config)]
    if not errors:
        warnings += [
            {"path": f"{block.path}.{name}", "message": message}
            for name, message in plugin.notes(config)
        ]
    return (None if errors else config), errors, warnings


def _unfilled(value: Any) -> str:
    """Why a value that is only a variable's placeholder (``"${header}"``) is still one."""
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        name = value[2:-1].split(":")[0]
        return f" (it is {value}: pass the variable {name} with the submission, -i {name}=...)"
    return ""


def _ignored(plugin: type[Plugin], leaf: str) -> str | None:
    """The ignored option ``leaf`` is, or lies inside (``properties.useSSL``)."""
    for name in plugin.ignored_options:
        if leaf == name or leaf.startswith(f"{name}."):
            return name
    return None


def _error(block: PluginBlock, option: str, message: str) -> dict:
    error = {"path": f"{block.path}.{option}", "message": message}
    if block.line:
        error["line"] = block.line
    return error


def table_names(full_name: str) -> dict[str, str]:
    """``db.schema.table``, ``db.table`` or ``table`` as the placeholders' values."""
    parts = full_name.split(".")
    database = parts[0] if len(parts) > 1 else ""
    schema = parts[1] if len(parts) == 3 else ""
    return {
        "${database_name}": database,
        "${schema_name}": schema,
        "${table_name}": parts[-1],
        "${table_full_name}": full_name,
    }


class SourcePlugin(Plugin):
    """A source: splits made by the enumerator, read by readers from an exact offset.

    ``read`` yields Arrow record batches (engine.connectors.batches). A source written for rows
    implements ``read_rows`` instead: ``read`` turns each of its lists into a batch."""

    section: ClassVar[str] = "source"
    #: The option whose list makes this a multi-table source, a pipeline per entry (each entry's
    #: options over the block's; engine.jobs.multitable); "" for a one-table source.
    tables_option: ClassVar[str] = ""

    @classmethod
    def table_entry_problem(cls, entry: Any) -> str | None:
        """Why an entry of ``tables_option`` cannot be planned; None when it can."""
        return None if isinstance(entry, dict) else "must be an object"

    @classmethod
    def placeholder_names(cls, config: dict[str, Any]) -> dict[str, str]:
        """The values of ``${database_name}``, ``${schema_name}``, ``${table_name}`` and
        ``${table_full_name}`` for the table a validated config reads ({}: it names none)."""
        return {}

    @classmethod
    def mode_problems(cls, config: dict[str, Any], mode: str) -> list[tuple[str, str]]:
        """What a valid config asks for that the job's mode (``env.job.mode``) cannot give,
        [(option name, message)]: a block is validated before the job's mode is known."""
        return []

    def output_schema(self):  # -> Schema
        raise NotImplementedError

    def create_splits(self, mode: str) -> list[dict]:
        """The job's splits, each a JSON-able dict with a unique ``splitId``."""
        raise NotImplementedError

    def read(self, split: dict, offset: int, mode: str, batch_size: int):
        """Yield ``(batch, next_offset)`` from ``offset``, a batch of at most ``batch_size``
        rows (none: nothing is due yet); a replay from an offset is exact."""
        from engine.connectors.arrowrows import arrow_schema
        from engine.connectors.batches import ROW_SOURCE_BATCH, from_rows

        schema = self.output_schema()
        arrow = arrow_schema(schema)
        size = min(batch_size, ROW_SOURCE_BATCH)
        for rows, next_offset in self.read_rows(split, offset, mode, size):
            yield from_rows(rows, schema, arrow), next_offset

    def read_rows(self, split: dict, offset: int, mode: str, batch_size: int):
        """A row source's ``read``: yield ``(rows, next_offset)``."""
        raise NotImplementedError


class TransformPlugin(Plugin):
    """Maps a batch to a batch: ``processor(schema)`` returns that function. A transform
    written for rows implements ``row_processor`` instead (a list of rows to a list)."""

    section: ClassVar[str] = "transform"

    def output_schema(self, schema):  # (Schema) -> Schema; ValueError names the bad field
        raise NotImplementedError

    def processor(self, schema):  # (Schema) -> Callable[[RecordBatch], RecordBatch]
        from engine.connectors.arrowrows import arrow_schema
        from engine.connectors.batches import from_rows, to_rows

        rows_fn = self.row_processor(schema)
        out = self.output_schema(schema)
        arrow = arrow_schema(out)

        def process(batch):
            return from_rows(rows_fn(to_rows(batch, schema)), out, arrow)

        return process

    def row_processor(self, schema):  # (Schema) -> Callable[[list[tuple]], list[tuple]]
        raise NotImplementedError


def later_sink(context: dict) -> str:
    """The index of a writer's sink in its pipeline when it is not the first (``sink[2]``:
    "2"), else "": writers' names for what they write (staged rows, parts) add it, so two sinks
    of one pipeline writing one target never take each other's."""
    label = str(context.get("label", ""))
    if label.startswith("sink[") and not label.startswith("sink[0]"):
        return label[5 : label.index("]")]
    return ""


class SinkWriter:
    """Writes batches (Arrow record batches, engine.connectors.batches); checkpoint hooks
    default to at-least-once (nothing to prepare). A writer written for rows implements
    ``write_rows`` instead of ``write``."""

    def write(self, batch) -> None:
        from engine.connectors.batches import to_rows

        self.write_rows(to_rows(batch))

    def write_rows(self, rows: list[tuple]) -> None:
        raise NotImplementedError

    def prepare_commit(self, checkpoint_id: int) -> dict:
        return {}

    def commit(self, state: dict) -> None:
        return None

    def close(self) -> None:
        """The task group finished: make what was written final."""
        return None

    def abort(self) -> None:
        """The task group was cancelled or failed: release resources, publish nothing more."""
        return None


class SchemaNotFollowed(Exception):
    """A sink cannot take a source's schema change: the reader fails, naming the sink."""


class SinkPlugin(Plugin):
    section: ClassVar[str] = "sink"

    def writer(self, schema, context: dict) -> SinkWriter:
        raise NotImplementedError

    def follow_schema(self, added: list[tuple[str, str]]) -> None:
        """A source's schema change reaches this sink with columns ``added`` (name, kind):
        make its target take them before the first row of the new schema. Called again after
        a restore, so it must be idempotent. A sink whose target has no columns to change
        (Console, Blackhole) does nothing; one that cannot follow raises."""
        names = ", ".join(name for name, _ in added)
        raise SchemaNotFollowed(
            f"the {self.name} sink cannot follow a schema change ({names} added)"
        )
