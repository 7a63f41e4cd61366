"""Delta Lake: tables, exactly-once ingest, Great Expectations suites, pools, snapshots, rebuilds from bronze,
a run's rows, and the checkpoint registry's rules; a lake on a local disk or in an s3:// bucket."""

from .expectations import LATE_CHECK, late_only
from .ingest import CommitRecord, IngestConfig, Ingestor, IngestStats, ingest, lag
from .lease import LeaseHeld
from .rebuild import rebuild_to, record_at
from .registry import (
    WEIGHTS,
    WEIGHTS_MANIFEST,
    checkpoint_path,
    file_sha256,
    registry_refusal,
    weight_files,
    weights_digest,
    weights_refusal,
    write_weights_manifest,
)
from .runs import RunRows
from .snapshots import TableVersion, quarantine_by_reason, read_pool, read_table, status, versions
from .storage import LakeFiles, StorageError, storage_options
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
    check_lake_root,
    silver,
)

__all__ = [
    "LATE_CHECK",
    "CHECKPOINTS",
    "D_ENV",
    "WEIGHTS",
    "WEIGHTS_MANIFEST",
    "D_TRAIN",
    "EVAL_ITEMS",
    "EVAL_RESULTS",
    "POOLS",
    "QUARANTINE",
    "SCHEMAS",
    "VALIDATIONS",
    "CommitRecord",
    "IngestConfig",
    "IngestStats",
    "Ingestor",
    "Lake",
    "LakeError",
    "LakeFiles",
    "RunRows",
    "StorageError",
    "LeaseHeld",
    "TableVersion",
    "bronze",
    "check_lake_root",
    "checkpoint_path",
    "file_sha256",
    "ingest",
    "late_only",
    "lag",
    "quarantine_by_reason",
    "read_pool",
    "read_table",
    "rebuild_to",
    "record_at",
    "registry_refusal",
    "silver",
    "weight_files",
    "weights_digest",
    "weights_refusal",
    "write_weights_manifest",
    "status",
    "storage_options",
    "versions",
]
