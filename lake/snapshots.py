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

from .ingest import COMMIT_RECORD_KEY
from .tables import POOLS, QUARANTINE, SCHEMAS, Lake, LakeError


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
