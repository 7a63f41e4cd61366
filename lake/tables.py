"""The lake's layout and table schemas.

    <root>/bronze/<topic>          raw Kafka records, exactly once (app transactions per partition)
    <root>/silver/<kind>           typed events that passed their expectation suite
    <root>/silver/quarantine       everything that did not, with the failed checks and the raw bytes
    <root>/silver/validations      one row per validation run; its commits are the refine layer's commit record
    <root>/gold/d_train            the agent's pool: rollouts joined with their rewards
    <root>/gold/d_env              the simulator's pool: generations joined with their batch's curriculum reward
    <root>/registry/checkpoints    every model version with its lineage
    <root>/eval/results, eval/items  offline benchmark results (genenv eval), per metric and per item

Beside the tables, a lake holds whole files: checkpoints/, runs/ (each run's configuration) and reports/, on a
local disk or in an s3:// bucket (lake/storage.py).

Every table is created up front with its schema, so each has a version from
the start and readers never meet a missing table.
"""

from __future__ import annotations

import contextlib
import types
import typing
from pathlib import Path

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.schema import Field

from streams.events import EVENT_TYPES, TOPICS, field_types

from .lease import LEASES, LEASES_SCHEMA
from .storage import LakeFiles, StorageError, check_remote_root, first_line, storage_options

# Where a record came from. Offsets are only meaningful within one Kafka cluster (a fresh local
# broker starts every log at 0 again), so the cluster id is part of every record's coordinates.
KAFKA_COLUMNS = [
    pa.field("kafka_cluster", pa.string(), nullable=False),
    pa.field("kafka_partition", pa.int32(), nullable=False),
    pa.field("kafka_offset", pa.int64(), nullable=False),
    pa.field("kafka_timestamp", pa.int64(), nullable=False),
]

BRONZE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        *KAFKA_COLUMNS,
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("ingested_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        *KAFKA_COLUMNS,
        pa.field("kind", pa.string()),
        pa.field("event_id", pa.string()),
        pa.field("task_id", pa.string()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("failed_checks", pa.list_(pa.string()), nullable=False),
        pa.field("raw", pa.binary()),
    ]
)

VALIDATIONS_SCHEMA = pa.schema(
    [
        pa.field("refine_seq", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("suite", pa.string(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("passed", pa.int64(), nullable=False),
        pa.field("failed", pa.int64(), nullable=False),
        pa.field("unexpected_counts", pa.string(), nullable=False),  # JSON {check: count}
        pa.field("success", pa.bool_(), nullable=False),
        pa.field("validated_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


def arrow_type(annotation) -> pa.DataType:
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return arrow_type(inner)
    if origin is list:
        (item,) = typing.get_args(annotation)
        return pa.list_(arrow_type(item))
    return {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}[annotation]


def event_schema(kind: str) -> pa.Schema:
    """Silver schema of an event kind: its fields, typed, then where it came from in Kafka."""
    fields = [pa.field(name, arrow_type(t)) for name, t in field_types(EVENT_TYPES[kind]).items()]
    return pa.schema(fields + KAFKA_COLUMNS)


D_TRAIN_SCHEMA = pa.schema(
    [
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("group_index", pa.int64(), nullable=False),
        pa.field("agent_model_version", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("completion", pa.string(), nullable=False),
        pa.field("completion_token_ids", pa.list_(pa.int64())),
        pa.field("behaviour_logprobs", pa.list_(pa.float64())),
        pa.field("temperature", pa.float64()),  # the sampling temperature (null: not recorded, warm-start answers)
        pa.field("turns_json", pa.string()),  # a multi-turn rollout's turns (each its own prompt and tokens); "[]"
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("success", pa.bool_(), nullable=False),
        pa.field("checker_detail", pa.string()),
        pa.field("rollout_event_id", pa.string(), nullable=False),
        pa.field("reward_event_id", pa.string(), nullable=False),
    ]
)

D_ENV_SCHEMA = pa.schema(
    [
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("batch_id", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("domain", pa.string(), nullable=False),
        pa.field("env_model_version", pa.string(), nullable=False),
        pa.field("sim_prompt", pa.string(), nullable=False),
        pa.field("raw_generation", pa.string(), nullable=False),
        pa.field("temperature", pa.float64()),  # the sampling temperature (null: not recorded, seed tasks)
        pa.field("task_prompt", pa.string()),
        pa.field("valid", pa.bool_(), nullable=False),
        pa.field("difficulty_json", pa.string()),
        pa.field("granularity", pa.string(), nullable=False),
        pa.field("p_hat", pa.float64(), nullable=False),
        pa.field("env_reward", pa.float64(), nullable=False),
        pa.field("weight", pa.float64(), nullable=False),
        pa.field("filtered", pa.bool_(), nullable=False),
        pa.field("task_event_id", pa.string(), nullable=False),
        pa.field("batch_event_id", pa.string(), nullable=False),
    ]
)

CHECKPOINTS_SCHEMA = pa.schema([f for f in event_schema("checkpoint") if f.name not in {c.name for c in KAFKA_COLUMNS}])

# Offline benchmark results (genenv eval): measurements of a model, written by the harness directly (they are
# not part of the co-evolution's event log), one row per metric and one per scored item.
EVAL_RESULTS_SCHEMA = pa.schema(
    [
        pa.field("eval_id", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),  # what was asked for: a built-in name, path or agent:vN
        pa.field("model_version", pa.string(), nullable=False),  # agent:vN with its sha256 prefix, or the model itself
        pa.field("benchmark", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("items", pa.int64(), nullable=False),
        pa.field("scoring", pa.string(), nullable=False),
        pa.field("config_json", pa.string(), nullable=False),
        pa.field("evaluated_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

EVAL_ITEMS_SCHEMA = pa.schema(
    [
        pa.field("eval_id", pa.string(), nullable=False),
        pa.field("benchmark", pa.string(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("category", pa.string(), nullable=False),
        pa.field("score", pa.float64(), nullable=False),
        pa.field("response", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("metrics_json", pa.string(), nullable=False),
    ]
)

SILVER_KINDS = tuple(EVENT_TYPES)  # task, rollout, reward, batch, checkpoint


def bronze(topic: str) -> str:
    return f"bronze/{topic}"


def silver(kind: str) -> str:
    return f"silver/{kind}"


QUARANTINE = "silver/quarantine"
VALIDATIONS = "silver/validations"
D_TRAIN = "gold/d_train"
D_ENV = "gold/d_env"
CHECKPOINTS = "registry/checkpoints"
EVAL_RESULTS = "eval/results"
EVAL_ITEMS = "eval/items"
POOLS = {"d_train": D_TRAIN, "d_env": D_ENV}
CHANGE_FEED = {"delta.enableChangeDataFeed": "true"}  # Delta's change data feed (set when a pool is created)
# A log checkpoint every 10 commits (delta-rs' default is 100), set when a table is created: opening a table replays
# the commits since its last checkpoint, so a pool read 95 commits after one took 3x a read just after it
# (docs/RESULTS.md, "Reads as the history grows"). Not on the lease table, which checkpoints and trims its own log.
CHECKPOINT_EVERY = {"delta.checkpointInterval": "10"}

SCHEMAS: dict[str, pa.Schema] = {
    **{bronze(topic): BRONZE_SCHEMA for topic in TOPICS.values()},
    **{silver(kind): event_schema(kind) for kind in SILVER_KINDS},
    QUARANTINE: QUARANTINE_SCHEMA,
    D_TRAIN: D_TRAIN_SCHEMA,
    D_ENV: D_ENV_SCHEMA,
    CHECKPOINTS: CHECKPOINTS_SCHEMA,
    VALIDATIONS: VALIDATIONS_SCHEMA,
    EVAL_RESULTS: EVAL_RESULTS_SCHEMA,
    EVAL_ITEMS: EVAL_ITEMS_SCHEMA,
    LEASES: LEASES_SCHEMA,
}

# Tables the refine step writes, in the order it writes them. VALIDATIONS is last:
# its commit is the commit record of a refine step (see lake/ingest.py).
DERIVED_TABLES: tuple[str, ...] = (
    *(silver(kind) for kind in SILVER_KINDS),
    QUARANTINE,
    D_TRAIN,
    D_ENV,
    CHECKPOINTS,
    VALIDATIONS,
)


class LakeError(RuntimeError):
    pass


def check_lake_root(root: str | Path) -> None:
    """LakeError (one line) for a lake root that cannot be one: a remote scheme genenv does not support, or a local
    path that is a file, or has a file where a folder above it should be. Nothing is created (a command checks
    this before any work starts)."""
    if "://" in str(root):
        try:
            check_remote_root(str(root))
        except StorageError as exc:
            raise LakeError(str(exc)) from None
        return
    path = Path(root)
    if path.exists() and not path.is_dir():
        raise LakeError(f"lake path {path} exists and is not a directory")
    above = next((p for p in path.absolute().parents if p.exists()), None)
    if not path.exists() and above is not None and not above.is_dir():
        raise LakeError(f"lake path {path}: {above} is not a directory")


class Lake:
    """A lake root: a local directory, or s3://bucket/prefix with its storage options from the environment
    (lake/storage.py). `delta` and `scan` open its tables with those options; `files` holds everything else."""

    def __init__(self, root: str | Path, create: bool = True):
        self.root = str(root).rstrip("/")
        self._writers: dict[str, DeltaTable] = {}
        self._readers: dict[str, DeltaTable] = {}
        check_lake_root(self.root)
        self.storage_options = storage_options()
        if "://" not in self.root:
            path = Path(self.root)
            if not create and not (path / "silver").is_dir():
                raise LakeError(f"no lake at {path} (run `genenv ingest --lake {path}` or `genenv run` first)")
            self.root = str(path.resolve())
        self.files = LakeFiles(self.root, self.storage_options)
        if "://" in self.root and not create and not self.exists(silver("task")):
            raise LakeError(f"no lake at {self.root} (run `genenv ingest --lake {self.root}` or `genenv run` first)")
        if create:
            self.ensure()
        else:
            with contextlib.suppress(LakeError):  # a lake from an older genenv gains the tables added since;
                self.ensure()  # one this process may not write is read as it is

    def uri(self, table: str) -> str:
        return f"{self.root}/{table}"

    def exists(self, table: str) -> bool:
        try:
            return DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options)
        except Exception as exc:  # noqa: BLE001 (an unreachable endpoint, refused credentials: one line)
            raise LakeError(f"cannot reach the lake at {self.root}: {first_line(exc)}") from None

    def delta(self, table: str, version: int | None = None) -> DeltaTable:
        """A table's delta-rs handle (at `version`, default the latest), opened with the lake's storage options."""
        return DeltaTable(self.uri(table), version=version, storage_options=self.storage_options)

    def scan(self, table: str, version: int | None = None) -> pl.LazyFrame:
        """A table as a Polars lazy frame (at `version`), opened with the lake's storage options."""
        return pl.scan_delta(self.uri(table), version=version, storage_options=self.storage_options or None)

    def ensure(self) -> None:
        """Create the tables that do not exist yet, and check a remote lake's files are writable; LakeError (one
        line) when the storage refuses."""
        try:
            if "://" not in self.root:
                Path(self.root).mkdir(parents=True, exist_ok=True)
            for name, schema in SCHEMAS.items():
                if not self.exists(name):
                    DeltaTable.create(
                        self.uri(name),
                        schema,
                        mode="ignore",
                        name=name.replace("/", "_"),
                        # the pools record their changes, so a trainer reads only the rows new since it last read
                        # (lake/snapshots.py `rows_appended`)
                        configuration={
                            **(CHECKPOINT_EVERY if name != LEASES else {}),
                            **(CHANGE_FEED if name in POOLS.values() else {}),
                        }
                        or None,
                        storage_options=self.storage_options,
                    )
                else:
                    self._add_missing_columns(name, schema)
            self.files.check_writable()
        except LakeError:
            raise
        except Exception as exc:  # noqa: BLE001 (OSError, DeltaError, ...: whatever the storage said, in one line)
            raise LakeError(
                f"cannot create a lake at {self.root}: {getattr(exc, 'strerror', None) or first_line(exc)}"
            ) from None

    def _add_missing_columns(self, name: str, schema: pa.Schema) -> None:
        """A table from an older genenv gains the columns added since (nullable: its old rows have none)."""
        table = self.delta(name)
        present = set(table.schema().to_arrow().names)
        missing = [Field.from_arrow(f.with_nullable(True)) for f in schema if f.name not in present]
        if missing:
            table.alter.add_columns(missing)

    def table(self, name: str, version: int | None = None) -> DeltaTable:
        if name not in SCHEMAS:
            raise LakeError(f"unknown table {name!r}; tables: {', '.join(sorted(SCHEMAS))}")
        if not self.exists(name):
            raise LakeError(f"table {name} does not exist under {self.root}")
        dt = self.delta(name)
        if version is not None:
            if version < 0 or version > dt.version():
                raise LakeError(f"{name} has no version {version} (latest is {dt.version()})")
            dt.load_as_version(version)
        return dt

    def latest(self, name: str) -> DeltaTable:
        """A table's handle at its newest version, kept between calls and brought up to date with only the commits
        since the last (delta-rs' update_incremental): opening a table anew reads its last log checkpoint, which
        lists every file the table has had since the last vacuum, so a trainer that asks what is new every update
        would pay for the whole history each time (docs/RESULTS.md, "Reads as the history grows")."""
        handle = self._readers.get(name)
        if handle is None:
            handle = self._readers[name] = self.table(name)
            return handle
        try:
            handle.update_incremental()
        except Exception:  # noqa: BLE001 (log entries it needs were cleaned up, the table re-created: open anew)
            handle = self._readers[name] = self.table(name)
        return handle

    def append(self, name: str, rows: pa.Table, commit_properties=None) -> int:
        """Append rows (cast to the table's schema) and return the new version."""
        handle = self._writers.get(name) or self._writers.setdefault(name, self.delta(name))
        write_deltalake(handle, rows.cast(SCHEMAS[name]), mode="append", commit_properties=commit_properties)
        return handle.version()

    def version(self, name: str) -> int:
        return self.delta(name).version()

    def compact(self, name: str) -> tuple[int, int, int]:
        """Rewrite the table's small files at its newest version into a few large ones (delta-rs' optimize.compact,
        the same rows as a new version); (the new version, files removed, files added)."""
        self._writers.pop(name, None)  # the next append opens the table at the compacted version
        table = self.delta(name)
        metrics = table.optimize.compact()
        return table.version(), int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])

    def vacuum(self, name: str, retention_hours: int, keep_versions: list[int], apply: bool) -> list[str]:
        """Delete (apply) or list the files the newest version does not read, that left more than retention_hours
        ago and that none of keep_versions reads (delta-rs' vacuum; its commits change no row)."""
        self._writers.pop(name, None)  # the next append opens the table after the vacuum's commits
        return self.delta(name).vacuum(
            retention_hours=retention_hours,
            dry_run=not apply,
            enforce_retention_duration=False,  # the table's own minimum (a week) would refuse a user's shorter one
            keep_versions=keep_versions or None,
        )

    def data_files(self, name: str) -> int:
        """How many data files the table's newest version reads."""
        return len(self.delta(name).file_uris())

    def restore(self, name: str, version: int) -> None:
        self._writers.pop(name, None)
        self.delta(name).restore(version)
