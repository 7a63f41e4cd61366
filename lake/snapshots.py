"""Reading the lake at explicit versions: what trainers and auditors use.

A pool read at version v is immutable: later appends create new versions and
never change what v returns. Trainers record the version they read, so "which
data made these weights" is always answerable.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa

from .ingest import COMMIT_RECORD_KEY
from .maintenance import VACUUM
from .tables import CHANGE_FEED, POOLS, QUARANTINE, SCHEMAS, Lake, LakeError


@dataclass(frozen=True)
class TableVersion:
    version: int
    timestamp: datetime
    operation: str
    metadata: dict


def read_table(lake: Lake, table: str, version: int | None = None) -> pl.DataFrame:
    """A table as a Polars frame, at `version` (default: the latest)."""
    dt = lake.table(table, version)
    return lake.scan(table, version=dt.version()).collect()


def read_pool(lake: Lake, pool: str, version: int | None = None) -> pl.DataFrame:
    """A gold pool ("d_train" or "d_env") at `version`."""
    if pool not in POOLS:
        raise LakeError(f"unknown pool {pool!r}; pools: {', '.join(POOLS)}")
    return read_table(lake, POOLS[pool], version)


APPENDS_ONLY = {"WRITE", "OPTIMIZE"}  # operations that add rows (the ingest's appends) or rewrite them unchanged


def rows_appended(lake: Lake, table: str, since: int, version: int) -> pl.DataFrame | None:
    """The rows appended to `table` after version `since`, up to `version`, read from Delta's change data feed:
    the files those appends added, not the whole table twice, so a trainer's read costs what is new, however long
    the pool's history. None where the feed cannot say it: a table created without the feed (a lake from before
    it), a commit in the range that did more than append or compact (a restore: its re-added files would read
    as new), or appends whose files a vacuum deleted since (it keeps the versions checkpoints read, not the commits
    between them: lake/maintenance.py). Compaction's rewritten files are not changes (dataChange false), so it
    never repeats a row."""
    if since >= version:
        return lake.scan(table, version=version).head(0).collect()
    dt = lake.latest(table)
    if any(dt.metadata().configuration.get(key) != value for key, value in CHANGE_FEED.items()):
        return None
    commits = dt.history(limit=dt.version() - since)
    if any(c.get("operation") not in APPENDS_ONLY for c in commits if since < c["version"] <= version):
        return None
    if any(c.get("operation") in VACUUM for c in commits if c["version"] > since):
        return None
    changes = pl.DataFrame(dt.load_cdf(starting_version=since + 1, ending_version=version).read_all())
    # The table's own schema, from the log already loaded: a scan for it opened the table a second time, which was
    # most of the read (a column added after `version` comes back null, where the version's scan leaves it out).
    schema = pl.from_arrow(pa.schema(dt.schema().to_arrow()).empty_table()).schema
    return (
        changes.filter(pl.col("_change_type") == "insert")
        .sort("_commit_version", maintain_order=True)
        .select([pl.col(name).cast(dtype) for name, dtype in schema.items()])
    )


def versions(lake: Lake, table: str) -> list[TableVersion]:
    """Every version of a table with its commit metadata, oldest first."""
    dt = lake.table(table)
    out = []
    for commit in dt.history():
        meta = {k: v for k, v in commit.items() if k not in {"version", "timestamp", "operation"}}
        if COMMIT_RECORD_KEY in meta:
            meta[COMMIT_RECORD_KEY] = json.loads(meta[COMMIT_RECORD_KEY])
        out.append(
            TableVersion(
                version=commit["version"],
                timestamp=datetime.fromtimestamp(commit["timestamp"] / 1000, tz=UTC),
                operation=commit.get("operation", ""),
                metadata=meta,
            )
        )
    return sorted(out, key=lambda v: v.version)


def status(lake: Lake) -> list[dict]:
    """Each table with its version and row count; the quarantine also by reason."""
    rows = []
    for name in sorted(SCHEMAS):
        dt = lake.delta(name)
        rows.append(
            {
                "table": name,
                "version": dt.version(),
                "rows": lake.scan(name, version=dt.version()).select(pl.len()).collect().item(),
            }
        )
    return rows


def quarantine_by_reason(lake: Lake) -> Counter:
    """Quarantined rows counted by the first check they failed (decode errors: the check, not the message)."""
    checks = lake.scan(QUARANTINE).select(pl.col("failed_checks").list.first()).collect()
    return Counter(checks["failed_checks"].to_list())
