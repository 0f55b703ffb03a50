"""A LocalFile source whose path is one file (not a directory) finds that file in the managed
lane, as Lane B reads it: once, named by the file's name."""

from __future__ import annotations

from tests.discoverykit import Discovered, write


def test_a_source_path_that_is_a_file_is_discovered_once(tmp_path):
    write(tmp_path / "one.csv", rows=2)
    kit = Discovered(tmp_path / "one.csv")
    try:
        assert [s["relativePath"] for s in kit.scan()] == ["one.csv"]
        assert kit.scan() == []
    finally:
        kit.close()
