"""Listing a LocalFile source's directory for the managed enumerator's discovery: the files
not known yet, each with its ctime, inode, size and mtime. A scan runs on the coordinator's
shared pool and reads only its arguments; it walks the directory one file at a time and keeps
at most about twice its limit of files (the oldest): beyond that, a large directory costs it
one directory's names at a time (``os.walk``), not a path and a record per file."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.connectors.localfile import walk_files

#: A scan sorts and cuts its files to its limit once it holds twice that and this many more.
TRIM_SLACK = 64


@dataclass(frozen=True)
class Found:
    """A file a scan found: its path under the directory, its ctime (ns) and inode."""

    name: str
    path: str
    ctime: int
    inode: int
    size: int = 0  # bytes: the split's, for its reader's backlog (localfile_backlog)
    mtime: int | None = None  # ns

    @property
    def arrived(self) -> int:
        """When it was there at the latest (a chmod moves its ctime, not its mtime)."""
        return self.ctime if self.mtime is None else min(self.ctime, self.mtime)


@dataclass(frozen=True)
class Listing:
    started: int  # ns, taken before the directory was listed
    found: tuple[Found, ...]  # at or above the watermark, and not known as they are
    older: int  # files left out below the watermark
    held: int | None = None  # the oldest ctime among files left out past the scan's limit
    left: int = 0  # how many it left out so
    newest: int | None = None  # the latest ``arrived`` of the files found


def oldest_first(found: Found) -> tuple[int, str]:
    return found.ctime, found.name


def scan(
    root: Path,
    config: dict,
    watermark: int | None,
    known: Mapping[str, tuple[int | None, int]],
    limit: int | None = None,
    until: int | None = None,
) -> Listing:
    """The files under ``root`` (or ``root`` itself) at or above ``watermark`` (there before
    ``until``) that ``known`` (path -> inode, ctime) does not hold as they are, in order; past
    ``limit`` of them, the oldest ``limit`` (and the oldest ctime of the rest). Runs on a worker
    of the shared pool: it reads only its arguments."""
    started = time.time_ns()
    found, older, cut, newest = [], 0, Cut(limit), None
    single = root.is_file()
    base = root.parent if single else root
    for path in [root] if single else walk_files(root, config):
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue  # gone since it was listed
        if watermark is not None and stat.st_ctime_ns < watermark:
            older += 1
            continue
        if until is not None and min(stat.st_ctime_ns, stat.st_mtime_ns) >= until:
            continue  # after a BATCH job's input
        name = path.relative_to(base).as_posix()
        if known.get(name) != (stat.st_ino, stat.st_ctime_ns):
            new = Found(
                name, str(path), stat.st_ctime_ns, stat.st_ino, stat.st_size, stat.st_mtime_ns
            )
            newest = new.arrived if newest is None else max(newest, new.arrived)
            found.append(new)
            found = cut.trim(found)
    found = cut.trim(found, final=True)
    if cut.left:
        return Listing(started, tuple(found), older, cut.held, cut.left, newest)
    return Listing(started, tuple(sorted(found, key=in_name_order)), older, newest=newest)


def in_name_order(found: Found) -> Path:
    return Path(found.path)


class Cut:
    """A scan's ``limit`` oldest files, kept as it walks (it holds at most about twice as
    many, never the directory), the oldest ctime of the rest, and how many those were."""

    def __init__(self, limit: int | None) -> None:
        self.limit, self.held, self.left = limit, None, 0

    def trim(self, found: list[Found], final: bool = False) -> list[Found]:
        limit = self.limit
        if limit is None or len(found) <= (limit if final else 2 * limit + TRIM_SLACK):
            return found
        found.sort(key=oldest_first)
        ctime = found[limit].ctime
        self.held = ctime if self.held is None else min(self.held, ctime)
        self.left += len(found) - limit
        return found[:limit]
