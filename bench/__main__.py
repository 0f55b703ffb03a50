"""``python -m bench [NAME ...] [--OPTION ...]``: run the named benchmarks (all when none is
named); options after the names go to the one benchmark named (its ``main(argv)``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from pathlib import Path


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    first_option = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    names, options = argv[:first_option] or available(), argv[first_option:]
    unknown = [n for n in names if n not in available()]
    if unknown:
        print(
            f"error: no benchmark named {', '.join(unknown)} (have: {', '.join(available())})",
            file=sys.stderr,
        )
        return 64
    if options and (len(names) != 1 or not takes_options(names[0])):
        print("error: options go to one named benchmark that takes them", file=sys.stderr)
        return 64
    for name in names:
        print(f"== bench/{name}")
        module = importlib.import_module(f"bench.{name}")  # one at a time: some set Django up
        module.main(options) if options else module.main()
    return 0


def takes_options(name: str) -> bool:
    return bool(inspect.signature(importlib.import_module(f"bench.{name}").main).parameters)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
