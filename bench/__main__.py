"""``python -m bench [NAME ...]``: run the named benchmarks (all when none is named)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    names = argv or available()
    unknown = [n for n in names if n not in available()]
    if unknown:
        print(
            f"error: no benchmark named {', '.join(unknown)} (have: {', '.join(available())})",
            file=sys.stderr,
        )
        return 64
    for name in names:
        print(f"== bench/{name}")
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
