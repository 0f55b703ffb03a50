"""Command-line options shared by the engine's commands and the local cluster's."""

from __future__ import annotations

from argparse import ArgumentParser

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
