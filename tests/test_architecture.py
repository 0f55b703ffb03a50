"""The architecture is enforced, not just drawn (docs/decisions/0008-layout.md).

The import contracts live in pyproject.toml and run with ``lint-imports``; the size rules (no
module over 500 lines, no repeated block outside migrations and tests) in tests/layout.py.
Both also run in ``./run lint``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.clusterkit import ROOT
from tests.layout import MAX_LINES, RUN, SOURCES, modules, oversized, repeated_runs

LINT_IMPORTS = str(ROOT / ".venv" / "bin" / "lint-imports")
PACKAGES = ("engine", "keel", "dashboard", "history", "devcluster")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_the_import_contracts_hold():
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 kept, 0 broken" in proc.stdout


def copy_of_the_code(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_a_worker_module_importing_a_master_module_breaks_the_contracts(tmp_path):
    """The rule is real: the same code with one import from the member side into the master
    side fails, and the failure names the contract and the import."""
    tree = copy_of_the_code(tmp_path)
    assert lint_imports(tree).returncode == 0  # the copy itself is clean
    runtime = tree / "engine" / "member" / "runtime.py"
    runtime.write_text(runtime.read_text() + "\nfrom engine.master import commands  # noqa\n")
    proc = lint_imports(tree)
    assert proc.returncode != 0
    assert "Member and master sides are independent" in proc.stdout
    assert "engine.member.runtime -> engine.master.commands" in proc.stdout


def test_an_import_cycle_breaks_the_contracts(tmp_path):
    tree = copy_of_the_code(tmp_path)
    terminal = tree / "engine" / "jobs" / "terminal.py"
    terminal.write_text(terminal.read_text() + "\nfrom engine.jobs import rollup  # noqa\n")
    proc = lint_imports(tree)
    assert proc.returncode != 0
    assert "No import cycles" in proc.stdout and "BROKEN" in proc.stdout


def test_no_module_is_over_the_size_limit():
    assert oversized() == [], f"modules over {MAX_LINES} lines"


def test_no_block_is_repeated_outside_migrations_and_tests():
    runs = repeated_runs(ROOT, modules(tests=False))
    assert runs == [], "\n".join(f"{a} ~ {b}" for a, b in runs)


def test_no_template_comment_spans_lines():
    """``{# #}`` is single-line in Django: one left open at the end of a line is printed on the
    page as text (``{% comment %}`` spans lines)."""
    open_comments = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "templates").rglob("*.html"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if line.count("{#") != line.count("#}")
    ]
    assert open_comments == []


def test_the_repeated_block_check_finds_a_copy(tmp_path):
    """A copied function, with its names changed, is found (so an empty answer means
    something)."""
    code = (ROOT / "engine" / "jobs" / "rollup.py").read_text()
    start = code.index("def _pipeline_target(")
    function = code[start : code.index("\ndef ", start + 1)]
    renamed = function.replace("_pipeline_target", "_stage_target").replace("ended", "done")
    for name, text in (("a.py", code), ("b.py", "from __future__ import annotations\n" + renamed)):
        (tmp_path / name).write_text(text)
    runs = repeated_runs(tmp_path, [tmp_path / "a.py", tmp_path / "b.py"])
    assert [(str(a).split(":")[0], str(b).split(":")[0]) for a, b in runs] == [("a.py", "b.py")]
    assert all(b.last - b.first + 1 >= RUN for _, b in runs)


def test_the_rules_cover_every_package():
    assert set(PACKAGES) <= set(SOURCES)
