"""Delta Lake: tables, exactly-once ingest, Great Expectations suites, pools, snapshots, rebuilds from bronze."""

from .ingest import CommitRecord, IngestConfig, Ingestor, IngestStats, ingest, lag
from .rebuild import rebuild_to, record_at
from .snapshots import TableVersion, quarantine_by_reason, read_pool, read_table, status, versions
from .tables import (
    CHECKPOINTS,
    D_ENV,
    D_TRAIN,
    EVAL_ITEMS,
    EVAL_RESULTS,
    POOLS,
    QUARANTINE,
    SCHEMAS,
    VALIDATIONS,
    Lake,
    LakeError,
    bronze,
    silver,
)

__all__ = [
    "CHECKPOINTS", "D_ENV", "D_TRAIN", "EVAL_ITEMS", "EVAL_RESULTS", "POOLS", "QUARANTINE", "SCHEMAS", "VALIDATIONS",
    "CommitRecord", "IngestConfig", "IngestStats", "Ingestor", "Lake", "LakeError", "TableVersion",
    "bronze", "ingest", "lag", "quarantine_by_reason", "read_pool", "read_table", "rebuild_to", "record_at", "silver",
    "status", "versions",
]
