"""Compaction: the small files that ingest steps append, rewritten into a few large ones, so that reading a table
costs what its rows cost, not what its history of steps does.

Every ingest step appends a file (a few rows) to each table it writes, and a scan opens every file of the
version it reads: after 10,000 steps a pool read opens 10,000 files. delta-rs' optimize.compact rewrites the
files of a table's newest version into a few large ones, as a new version holding the same rows (Delta marks it
dataChange false). Earlier versions still name the old files, which stay, so time travel, audit and replay read
what they read before; genenv never vacuums (deleting them is the user's call, with `keep_versions` for every
pool version a registered checkpoint names). delta-rs writes a log checkpoint every 100 commits itself
(delta.checkpointInterval), so finding a version's files reads at most 100 commits of log: nothing to add there.

Invariants (the ingestor keeps them, lake/ingest.py `Ingestor.maintain`):
- Only the ingestor compacts, under its lease, between refine steps: no other writer's commit is in between.
- A derived table's compacted version is named by a commit record, as a refine step's versions are: a row of
  kind "maintenance" in silver/validations carries it. So `recover` keeps the version (it rolls back only what
  no record names), and `record_at` finds it, which replay needs when a trainer read the pool just after.
- Bronze tables are compacted too; their Kafka offsets (Delta app transactions) are table state, which a
  compaction commit carries over.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from .tables import Lake

COMPACT_FILES = 64  # a table whose newest version reads more files than this is compacted


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
