"""Rebuilding derived tables from the bronze log into a scratch lake: what `genenv replay` stands on.

    source lake (read only)                    scratch lake
    bronze/<topic>  --rows up to watermark W-->  bronze/<topic>  --refine (the ingestor's recovery)-->  silver, gold

Invariants:
- The source lake is never written.
- The scratch lake is refined only up to watermarks taken from the source's commit records, oldest
  first; after `rebuild_to(W)` its derived tables hold what the same refine code makes of exactly
  the bronze records at or before W. A source pool at version v is therefore matched by the scratch
  pool after `rebuild_to(record_at(source, pool, v).watermark)`.
- `run_id` narrows the rebuild to the records whose payload names that run (read with a JSON path in
  Polars, not parsed row by row). Updates train on one run's rows and every row id contains its run's
  ids, so a run's pool rows do not depend on other runs' records, and a replay costs what the run's
  log costs, not what the whole lake's does.
- Refining is the ingestor's own recovery path (refine what bronze holds past the watermark), so a
  rebuild exercises the same code as a restart after a crash, not a copy of it.
"""

from __future__ import annotations

import polars as pl

from streams.kafka import ALL_TOPICS

from .ingest import CommitRecord, Ingestor
from .refine import Watermark, refined
from .tables import Lake, LakeError, bronze


def record_at(lake: Lake, table: str, version: int) -> CommitRecord:
    """The first complete refine step after which `table` stood at `version` (the empty record for version 0)."""
    if version == 0:
        return CommitRecord.empty()
    for record in CommitRecord.history(lake):
        if record.versions.get(table, 0) >= version:
            if record.versions[table] != version:
                break
            return record
    raise LakeError(f"{table}@{version} was not written by a refine step of {lake.root} (no commit record names it)")


def rebuild_to(source: Lake, scratch: Lake, watermark: Watermark, run_id: str | None = None) -> CommitRecord:
    """Copy the source's bronze records up to `watermark` that the scratch lake lacks (only `run_id`'s, if given),
    refine them; the scratch lake's new commit record."""
    done = CommitRecord.read(scratch).watermark
    for topic in ALL_TOPICS:
        wanted = refined(watermark.get(topic, {})) & ~refined(done.get(topic, {}))
        if run_id is not None:
            wanted &= pl.col("value").cast(pl.String, strict=False).str.json_path_match("$.run_id") == run_id
        rows = source.scan(bronze(topic)).filter(wanted).collect()
        if rows.height:
            scratch.append(bronze(topic), rows.sort(["kafka_cluster", "kafka_partition", "kafka_offset"]).to_arrow())
    # Refines what bronze holds past the watermark, as after a crash; checkpoint events are checked against the
    # source lake's checkpoints (the scratch lake has none).
    Ingestor(scratch, bootstrap="", checkpoints_of=source).recover()
    return CommitRecord.read(scratch)
