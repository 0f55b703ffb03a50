"""Command-line options shared by the engine's commands and the local cluster's."""

from __future__ import annotations

from argparse import Action, ArgumentParser, ArgumentTypeError

from engine.states import SlotMode


def add_slot_options(parser: ArgumentParser) -> None:
    """``--slots N`` and ``--fixed-slots`` (the default) or ``--dynamic-slots``."""
    parser.add_argument("--slots", type=int, default=8)
    mode = parser.add_mutually_exclusive_group()
    for flag, slot_mode in (
        ("--fixed-slots", SlotMode.FIXED),
        ("--dynamic-slots", SlotMode.DYNAMIC),
    ):
        mode.add_argument(flag, dest="slot_mode", action="store_const", const=slot_mode)
    parser.set_defaults(slot_mode=SlotMode.FIXED)


def tag_pair(text: str) -> tuple[str, str]:
    """``key=value`` -> (key, value): a worker tag, as ``--tag`` takes it."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or any(c.isspace() or c in ",:" for c in key):
        raise ArgumentTypeError(f"{text!r}: a tag is key=value (a key without spaces, ',' or ':')")
    return key, value


class _Tags(Action):
    """Each ``--tag key=value`` adds to one ``{key: value}`` (a later key wins)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        key, value = values
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), key: value})


def add_tag_option(parser: ArgumentParser) -> None:
    """``--tag key=value`` (repeatable): the worker's tags, which a job's ``tag_filter``
    matches."""
    parser.add_argument(
        "--tag",
        dest="tags",
        type=tag_pair,
        action=_Tags,
        metavar="KEY=VALUE",
        help="a tag of this worker, matched by a job's env.tag_filter (repeatable)",
    )


def worker_tags(text: str) -> tuple[str | None, dict[str, str]]:
    """``[WORKER:]key=value[,key=value...]`` -> (the worker's name or None for every worker,
    its tags), as ``cluster up --worker-tags`` takes it."""
    head, sep, rest = text.partition(":")
    name, pairs = (head.strip(), rest) if sep and "=" not in head else (None, text)
    if name == "":
        raise ArgumentTypeError(f"{text!r}: no worker name before ':'")
    return name, dict(tag_pair(pair) for pair in pairs.split(",") if pair.strip())
