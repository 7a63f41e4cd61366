"""Delta Lake: tables, exactly-once ingest, Great Expectations suites, pools and snapshots."""

from .ingest import CommitRecord, IngestConfig, Ingestor, IngestStats, ingest, lag
from .snapshots import TableVersion, quarantine_by_reason, read_pool, read_table, status, versions
from .tables import (
    CHECKPOINTS,
    D_ENV,
    D_TRAIN,
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
    "CHECKPOINTS", "D_ENV", "D_TRAIN", "POOLS", "QUARANTINE", "SCHEMAS", "VALIDATIONS",
    "CommitRecord", "IngestConfig", "IngestStats", "Ingestor", "Lake", "LakeError", "TableVersion",
    "bronze", "ingest", "lag", "quarantine_by_reason", "read_pool", "read_table", "silver", "status", "versions",
]
