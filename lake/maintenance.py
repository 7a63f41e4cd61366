"""Compaction and vacuum: the small files that ingest steps append, rewritten into a few large ones, so that reading a
table costs what its rows cost, not what its history of steps does; and the files no version still needed reads,
deleted, so that the lake's disk does not grow with its history either.

Every ingest step appends a file (a few rows) to each table it writes, and a scan opens every file of the
version it reads: after 10,000 steps a pool read opens 10,000 files. delta-rs' optimize.compact rewrites the
files of a table's newest version into a few large ones, as a new version holding the same rows (Delta marks it
dataChange false). Earlier versions still name the old files, which stay until a vacuum. delta-rs writes a log
checkpoint every 100 commits itself (delta.checkpointInterval), so finding a version's files reads at most 100
commits of log: nothing to add there.

Vacuum (delta-rs' vacuum) deletes the files that the newest version does not read and that left the table more
than `retain_hours` ago, except the files of `keep_versions`: here every pool version a registered checkpoint
read (its update's rows, and its child's "seen" version: a replay of any registered update reads its pool at
exactly those two) and every version the ingest's commit record names (a restart restores to them). So replay
and audit keep working whatever the retention; older versions of the other tables become unreadable, which
nothing in genenv reads (time travel is on the pools only). A trainer's read of the pool between two kept
versions falls back from the change feed to the two versions when the appends in between were vacuumed
(lake/snapshots.py `rows_appended`).

Invariants (the ingestor keeps them, lake/ingest.py `Ingestor.maintain`):
- Only the ingestor compacts and vacuums, under its lease, between refine steps: no other writer's commit is in
  between. `genenv lake vacuum` is the same call, for a lake no ingestor is writing.
- A derived table's compacted version is named by a commit record, as a refine step's versions are: a row of
  kind "maintenance" in silver/validations carries it. So `recover` keeps the version (it rolls back only what
  no record names), and `record_at` finds it, which replay needs when a trainer read the pool just after.
- Bronze tables are compacted too; their Kafka offsets (Delta app transactions) are table state, which a
  compaction commit carries over.
- A vacuum that a user asks for (the ingestor's, `genenv lake vacuum`) keeps at least MIN_RETAIN_HOURS of every
  table: an update in flight reads a pool version that no checkpoint names yet.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import polars as pl

from .tables import CHECKPOINTS, Lake

COMPACT_FILES = 64  # a table whose newest version reads more files than this is compacted
RETAIN_HOURS = 168.0  # Delta's own default (delta.deletedFileRetentionDuration): a week of every table's history
MIN_RETAIN_HOURS = 1.0
VACUUM = {"VACUUM START", "VACUUM END"}  # the commits a vacuum adds to a table's log: no row changes
VACUUM_EVERY_S = 3600.0  # how often the ingestor vacuums (listing every table's files is not free on s3)


def compact(lake: Lake, tables: list[str], min_files: int = COMPACT_FILES) -> dict[str, dict]:
    """Compact each of `tables` that reads more than `min_files` files: {table: {version, files_removed,
    files_added}} for those compacted."""
    done = {}
    for name in tables:
        if lake.exists(name) and lake.data_files(name) > min_files:
            version, removed, added = lake.compact(name)
            done[name] = {"version": version, "files_removed": removed, "files_added": added}
    return done


def maintenance_row(seq: int, done: dict[str, dict], now: float) -> dict:
    """The silver/validations row of a compaction step (kind "maintenance", suite "compact"): `rows` the files it
    rewrote, `passed` the files it wrote, unexpected_counts each table's [files rewritten, files written]."""
    return {
        "refine_seq": seq,
        "kind": "maintenance",
        "suite": "compact",
        "rows": sum(d["files_removed"] for d in done.values()),
        "passed": sum(d["files_added"] for d in done.values()),
        "failed": 0,
        "unexpected_counts": json.dumps({name: [d["files_removed"], d["files_added"]] for name, d in done.items()}),
        "success": True,
        "validated_at": datetime.fromtimestamp(now, tz=UTC),
    }


def rows_changed_since(lake: Lake, name: str, version: int) -> bool:
    """Whether the table has a commit after `version` other than a vacuum's (which changes no row)."""
    table = lake.delta(name)  # opened once: a restart asks this of every derived table
    latest = table.version()
    if latest <= version:
        return False
    commits = table.history(limit=latest - version)
    return any(c.get("operation") not in VACUUM for c in commits if c["version"] > version)


def replay_versions(lake: Lake, record_versions: dict[str, int] | None = None) -> dict[str, set[int]]:
    """Per table, the versions a vacuum keeps: every pool version a registered checkpoint read, and the versions
    the ingest's commit record names."""
    keep: dict[str, set[int]] = {name: {version} for name, version in (record_versions or {}).items()}
    if lake.exists(CHECKPOINTS):
        read = lake.scan(CHECKPOINTS).select("pool_table", "pool_version").unique().collect()
        for table, version in read.filter(pl.col("pool_version") >= 0).iter_rows():
            keep.setdefault(table, set()).add(version)
    return keep


def vacuum(
    lake: Lake,
    tables: list[str],
    retain_hours: float = RETAIN_HOURS,
    record_versions: dict[str, int] | None = None,
    apply: bool = True,
) -> dict[str, int]:
    """Delete (apply) or list the files of `tables` that the newest version does not read, that left more than
    retain_hours ago and that no version of `replay_versions` reads: {table: files}."""
    keep = replay_versions(lake, record_versions)
    done = {}
    for name in tables:
        if not lake.exists(name):
            continue
        done[name] = len(lake.vacuum(name, math.ceil(retain_hours), sorted(keep.get(name, ())), apply))
    return done
