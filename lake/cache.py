"""The local cache of a remote lake's folders: one writer per folder at a time, and a bound on its size.

Several processes fill one cache (the ranks of a data-parallel update, a run's workers, the ingestor), each
fetching the checkpoints it loads. Without a lock, one process could delete a folder (a stale or partial copy it
is replacing) while another reads it. Without a bound, the cache holds every checkpoint a run ever loaded.

Invariants:
- A cached folder is checked, replaced or evicted only under its lock: `<folder>.lock` beside it, an advisory
  `flock`, which the kernel releases when its process dies, so a killed process never leaves it locked.
- Eviction removes the least recently used checkpoint folders (fetching one marks it used) until the cache's
  checkpoints fit in $GENENV_CACHE_GB (default 100), never the folder just fetched and never one whose lock
  another process holds. The folder a process has just fetched is the most recently used, so it is the last
  to go while that process loads it.

Why by hand: filelock and friends lock, but nothing in the dependencies bounds a folder cache by recency; both
parts are a few lines over fcntl and os.scandir.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

DEFAULT_LIMIT_GB = 100.0


@contextlib.contextmanager
def locked(folder: Path, wait: bool = True) -> Iterator[bool]:
    """Hold `folder`'s lock for the block; yields False (without the lock) when wait is False and another
    process holds it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def mark_used(folder: Path) -> None:
    os.utime(folder)


def limit_bytes() -> int:
    raw = os.environ.get("GENENV_CACHE_GB")
    try:
        gigabytes = DEFAULT_LIMIT_GB if raw is None else float(raw)
    except ValueError:
        raise ValueError(f"GENENV_CACHE_GB={raw!r} is not a number of gigabytes") from None
    if not gigabytes >= 0:
        raise ValueError(f"GENENV_CACHE_GB must be >= 0, got {raw}")
    return int(gigabytes * 2**30)


def size(folder: Path) -> int:
    """The bytes of the files under `folder`."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def evict(root: Path, keep: Path, limit: int | None = None) -> list[Path]:
    """Remove the least recently used checkpoint folders under `root` (…/checkpoints/<kind>/v<n>) until they fit
    in `limit` bytes (default: $GENENV_CACHE_GB); the folders removed."""
    limit = limit_bytes() if limit is None else limit
    folders = [f for f in root.glob("**/checkpoints/*/v*") if f.is_dir() and not f.name.endswith(".partial")]
    sizes = {f: size(f) for f in folders}
    total = sum(sizes.values())
    removed = []
    for folder in sorted(folders, key=lambda f: f.stat().st_mtime):
        if total <= limit:
            break
        if folder == keep:
            continue
        with locked(folder, wait=False) as mine:
            if mine and folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)
                total -= sizes[folder]
                removed.append(folder)
    return removed
