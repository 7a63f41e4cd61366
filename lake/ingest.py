"""Exactly-once ingest: Kafka topics -> bronze -> refine -> silver, quarantine, gold.

Invariants (the kafka-delta-ingest way, extended to the derived tables):

1. Bronze is the source of truth for Kafka progress. Each bronze commit carries,
   for every partition it holds rows of, a Delta app transaction
   `genenv-ingest/<cluster>/<topic>/<partition>` whose version is the last offset
   written. On start each partition is consumed from that version + 1. Kafka's
   committed offsets are never read or written. Offsets are scoped by the cluster
   id because a new cluster (a fresh local broker) numbers its logs from 0 again;
   every record's coordinates are (cluster, topic, partition, offset).
2. A refine step writes the derived tables in a fixed order, silver/validations
   last. That last commit carries the step's *commit record* in its commit
   metadata: the step number, the bronze watermark (last offset refined per
   topic-partition) and every derived table's version after the step.
3. On start, a derived table that is newer than the commit record says (a step
   died half way) is restored to the recorded version; then the bronze rows past
   the watermark are refined again, before anything new is read from Kafka. A
   step is therefore visible in full or not at all.
4. The refine state is derived from the tables at that point (RefineState.load).
5. Every `compact_every` steps the tables grown past many small files are compacted (lake/maintenance.py), and
   the derived tables' new versions are named by a commit record of their own (a "maintenance" row), so 3 keeps
   them; at most once an hour, the files older than `retain_hours` that no version a replay or a restart needs
   reads are vacuumed.

So every record Kafka offers lands once in bronze and once in exactly one of
silver/<kind> or silver/quarantine (or, a second copy of an event that landed with
the same content, is counted as a redelivery; or, a rollout or reward quarantined
only because its task had not landed, in the quarantine and then, once the task
lands, in silver too), however often the ingestor is killed. No record can stop
a step (lake/refine.py), so a restart never meets a bronze row that stopped the
last run.
Memory is bounded by the micro-batch (`max_batch_records`, `max_batch_bytes`; an
event is at most 1 MiB), the rows waiting for their task (`max_pending`), and the
id index of what has landed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, Transaction

from streams.events import EVENT_TYPES, TOPICS, content_digest, decode, field_types
from streams.kafka import ALL_TOPICS, assigned_consumer, cluster_id, ensure_topics, partitions_of

from .lease import LEASES, TTL_S, Lease
from .maintenance import (
    COMPACT_FILES,
    RETAIN_HOURS,
    VACUUM_EVERY_S,
    compact,
    maintenance_row,
    rows_changed_since,
    vacuum,
)
from .refine import RawRecord, RefineOutput, Refiner, RefineState, Watermark, bronze_record, refined
from .tables import BRONZE_SCHEMA, DERIVED_TABLES, SCHEMAS, VALIDATIONS, Lake, LakeError, bronze, silver

log = logging.getLogger(__name__)

COMMIT_RECORD_KEY = "genenv.refine"


def app_id(cluster: str, topic: str, partition: int) -> str:
    return f"genenv-ingest/{cluster}/{topic}/{partition}"


@dataclass
class IngestConfig:
    max_batch_records: int = 20_000  # a micro-batch closes at this many records ...
    max_batch_bytes: int = 16 << 20  # ... or at this many bytes of values (a refine step holds ~10x that) ...
    max_batch_ms: int = 1_000  # ... or after this long, whichever comes first
    max_wait_s: float = 30.0  # how long a rollout/reward waits for its task before quarantine
    max_pending: int = 100_000  # how many rows may wait for their task at once
    partitions: int = 3  # partitions per topic when the ingestor creates the topics
    topics: tuple[str, ...] = ALL_TOPICS
    lease_ttl_s: float = TTL_S  # a dead ingestor's lease on the lake lapses after this long (lake/lease.py)
    # After this many refine steps, compact the tables whose newest version reads more than `compact_files` files
    # (lake/maintenance.py): reads then stay flat as a long run's history grows. 0: never.
    compact_every: int = 100
    compact_files: int = COMPACT_FILES
    # With compaction, at most once an hour: delete the files that left the tables more than this long ago, except
    # those of every version a replay or a restart reads (lake/maintenance.py). 0: never.
    retain_hours: float = RETAIN_HOURS


@dataclass
class CommitRecord:
    seq: int = 0
    watermark: Watermark = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"seq": self.seq, "watermark": self.watermark, "versions": self.versions}, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> CommitRecord:
        data = json.loads(raw)
        watermark = {
            t: {c: {int(p): o for p, o in parts.items()} for c, parts in logs.items()}
            for t, logs in data["watermark"].items()
        }
        return cls(data["seq"], watermark, data["versions"])

    @classmethod
    def empty(cls) -> CommitRecord:
        return cls(versions={name: 0 for name in DERIVED_TABLES})

    @classmethod
    def read(cls, lake: Lake) -> CommitRecord:
        """The commit record of the last complete refine step (an empty one before the first). The newest commits
        are read first, a few at a time: the record is almost always the newest, and the whole history grows with
        the lake's age."""
        table, limit = lake.delta(VALIDATIONS), 8
        while True:
            commits = table.history(limit=limit)  # newest first
            for commit in commits:
                raw = commit.get(COMMIT_RECORD_KEY)
                if raw:
                    return cls.from_json(raw)
            if len(commits) < limit:
                return cls.empty()
            limit *= 8

    @classmethod
    def history(cls, lake: Lake) -> list[CommitRecord]:
        """Every complete refine step's commit record, oldest first."""
        raws = [c.get(COMMIT_RECORD_KEY) for c in lake.delta(VALIDATIONS).history()]
        return sorted((cls.from_json(raw) for raw in raws if raw), key=lambda r: r.seq)


@dataclass
class IngestStats:
    records: int = 0
    steps: int = 0
    redeliveries: int = 0  # second copies of landed events, dropped (lake/refine.py)
    rows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # by phase

    @contextlib.contextmanager
    def timed(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def summary(self) -> dict:
        return {
            "records": self.records,
            "steps": self.steps,
            "redeliveries": self.redeliveries,
            "rows": dict(sorted(self.rows.items())),
            "seconds": {k: round(v, 2) for k, v in sorted(self.seconds.items())},
        }


def stored_offsets(lake: Lake, cluster: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """Last offset of each partition of this cluster that bronze holds, from its app transactions."""
    table = lake.delta(bronze(topic))
    offsets = {}
    for p in partitions:
        version = table.transaction_version(app_id(cluster, topic, p))
        if version is not None:
            offsets[p] = version
    return offsets


class Ingestor:
    def __init__(
        self,
        lake: Lake,
        bootstrap: str,
        config: IngestConfig | None = None,
        runner=None,
        checkpoints_of: Lake | None = None,
    ):
        """`checkpoints_of`: the lake whose checkpoints/ a CheckpointPublished must name (default: `lake`;
        a rebuild into a scratch lake checks against its source)."""
        self.lake = lake
        self.checkpoints_of = checkpoints_of or lake
        self.bootstrap = bootstrap
        self.config = config or IngestConfig()
        self.stats = IngestStats()
        self.consumer = None
        self._runner = runner
        self.refiner: Refiner | None = None
        self.record: CommitRecord | None = None
        self.lease: Lease | None = None
        self.steps_since_compaction = 0
        self.vacuumed_at = time.monotonic()  # the first vacuum an hour into ingesting: a short run keeps every file

    # -- start ----------------------------------------------------------------------------------
    def start(self) -> Ingestor:
        """Take the lake's ingest lease (LeaseHeld, before anything is written, when another ingestor holds it),
        recover, and position the consumer after what bronze holds."""
        self.lease = Lease(self.lake.uri(LEASES), self.lake.storage_options, ttl_s=self.config.lease_ttl_s)
        self.lease.take()
        ensure_topics(self.bootstrap, self.config.partitions, self.config.topics)
        self.recover()
        self.cluster = cluster_id(self.bootstrap)
        self.consumer = assigned_consumer(
            self.bootstrap,
            self.config.topics,
            client_id="genenv-ingest",
            max_poll_records=self.config.max_batch_records,
        )
        for topic in self.config.topics:
            tps = partitions_of(self.consumer, topic)
            stored = stored_offsets(self.lake, self.cluster, topic, [tp.partition for tp in tps])
            for tp in tps:
                if tp.partition in stored:
                    self.consumer.seek(tp, stored[tp.partition] + 1)
        return self

    def recover(self) -> None:
        """Roll back a half-written refine step, rebuild the state, refine what bronze holds beyond the watermark."""
        record = CommitRecord.read(self.lake)
        for name in DERIVED_TABLES:
            expected = record.versions.get(name, 0)
            if rows_changed_since(self.lake, name, expected):
                log.warning("restoring %s to version %d (a refine step did not complete)", name, expected)
                self.lake.restore(name, expected)
        self.record = record
        state = RefineState.load(self.lake, record.watermark, max_late=self.config.max_pending)
        self.refiner = Refiner(
            state,
            self._runner,
            self.config.max_wait_s,
            self.config.max_pending,
            landed_digests=self._landed_digests,
            checkpoint_files=self.checkpoints_of.files,
        )
        gap = self._bronze_past_watermark(record.watermark)
        if gap:
            log.info("refining %d bronze records past the watermark", len(gap))
            self._refine_and_commit(gap)

    def _landed_digests(self, kind: str, event_ids: list[str]) -> dict[str, str]:
        """The content digests of events that landed in silver/<kind> in earlier steps (duplicates are rare:
        one pruned scan per micro-batch that has any)."""
        if not event_ids:
            return {}
        fields = list(field_types(EVENT_TYPES[kind]))
        with self.stats.timed("duplicate lookups"):
            rows = self.lake.scan(silver(kind)).filter(pl.col("event_id").is_in(event_ids)).select(fields)
            return {row["event_id"]: content_digest(row) for row in rows.collect().iter_rows(named=True)}

    def _bronze_past_watermark(self, watermark: Watermark) -> list[RawRecord]:
        records = []
        for topic in self.config.topics:
            rows = self.lake.scan(bronze(topic)).filter(~refined(watermark.get(topic, {}))).collect()
            rows = rows.sort(["kafka_cluster", "kafka_partition", "kafka_offset"])
            records.extend(bronze_record(row) for row in rows.iter_rows(named=True))
        return records

    # -- the loop -------------------------------------------------------------------------------
    def poll_batch(self) -> list[RawRecord]:
        cfg = self.config
        batch: list[RawRecord] = []
        size = 0
        deadline = time.monotonic() + cfg.max_batch_ms / 1000
        while len(batch) < cfg.max_batch_records and size < cfg.max_batch_bytes:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            polled = self.consumer.poll(timeout_ms=remaining_ms, max_records=cfg.max_batch_records - len(batch))
            for tp, messages in polled.items():
                batch.extend(
                    RawRecord(self.cluster, tp.topic, tp.partition, m.offset, m.timestamp, m.key, m.value)
                    for m in messages
                )
                size += sum(len(m.value or b"") for m in messages)
        return batch

    def run(self, idle_exit_s: float | None = None, stop=None, on_step=None) -> IngestStats:
        """Consume until `stop()` is true, or until nothing arrived for `idle_exit_s` seconds."""
        if self.consumer is None:
            self.start()
        last_data = time.monotonic()
        while not (stop and stop()):
            with self.stats.timed("poll"):
                batch = self.poll_batch()
            if batch:
                self.step(batch)
                last_data = time.monotonic()
                if on_step:
                    on_step(self.stats)
                continue
            self._release_expired()
            self.lease.renew_if_due()
            idle = time.monotonic() - last_data
            if idle_exit_s is not None and idle >= idle_exit_s and not self.refiner.state.pending:
                break
        return self.stats

    def step(self, batch: list[RawRecord]) -> None:
        if self.lease is not None:
            self.lease.renew_if_due()  # LeaseHeld if another ingestor took the lake meanwhile: write nothing
        with self.stats.timed("bronze"):
            self.write_bronze(batch)
        self._verify_checkpoints(batch)
        self._refine_and_commit(batch)
        self.steps_since_compaction += 1
        if self.config.compact_every and self.steps_since_compaction >= self.config.compact_every:
            self.maintain()

    def maintain(self) -> None:
        """Compact the tables grown past `compact_files` files, with the lease kept alive meanwhile, and name the
        derived tables' compacted versions in a commit record: a step of its own, whose silver/validations row
        (kind "maintenance", suite "compact") counts the files each table had and has."""
        self.steps_since_compaction = 0
        tables = [bronze(topic) for topic in self.config.topics] + list(DERIVED_TABLES)
        alive = self.lease.kept_alive() if self.lease is not None else contextlib.nullcontext()
        with alive, self.stats.timed("compact"):
            done = compact(self.lake, tables, self.config.compact_files)
            if self.config.retain_hours and time.monotonic() - self.vacuumed_at > VACUUM_EVERY_S:
                self.vacuumed_at = time.monotonic()
                vacuum(self.lake, tables, self.config.retain_hours, self.record.versions)
        derived = {name: d for name, d in done.items() if name in DERIVED_TABLES}
        if not derived:
            return
        seq = self.record.seq + 1
        versions = {**self.record.versions, **{name: d["version"] for name, d in derived.items()}}
        out = RefineOutput()
        out.add(VALIDATIONS, maintenance_row(seq, done, time.time()))
        self._commit(out, CommitRecord(seq, self.record.watermark, versions))

    def _verify_checkpoints(self, batch: list[RawRecord]) -> None:
        """Hash the weights of the batch's CheckpointPublished events before the refine step, with the lease kept
        alive meanwhile (Refiner.verify): the step itself stays short, and a slow hash does not lose the lake."""
        events = []
        for record in batch:
            if record.topic == TOPICS["checkpoint"]:
                try:
                    event = decode(record.value)
                except Exception:  # noqa: BLE001 (the refine step quarantines it with its reason)
                    continue
                if event.KIND == "checkpoint":
                    events.append(event)
        if not events:
            return
        alive = self.lease.kept_alive() if self.lease is not None else contextlib.nullcontext()
        with alive, self.stats.timed("verify"):
            for event in events:
                self.refiner.verify(event)

    def write_bronze(self, batch: list[RawRecord]) -> None:
        now = datetime.now(UTC)
        by_topic: dict[str, list[RawRecord]] = defaultdict(list)
        for r in batch:
            by_topic[r.topic].append(r)
        for topic, records in by_topic.items():
            last = {}
            for r in records:
                last[r.cluster, r.partition] = max(last.get((r.cluster, r.partition), -1), r.offset)
            rows = pa.table(
                {
                    "topic": pa.array([topic] * len(records), pa.string()),
                    "kafka_cluster": pa.array([r.cluster for r in records], pa.string()),
                    "kafka_partition": pa.array([r.partition for r in records], pa.int32()),
                    "kafka_offset": pa.array([r.offset for r in records], pa.int64()),
                    "kafka_timestamp": pa.array([r.timestamp for r in records], pa.int64()),
                    "key": pa.array([r.key for r in records], pa.binary()),
                    "value": pa.array([r.value for r in records], pa.binary()),
                    "ingested_at": pa.array([now] * len(records), pa.timestamp("us", tz="UTC")),
                },
                schema=BRONZE_SCHEMA,
            )
            txns = [Transaction(app_id(cluster, topic, p), offset) for (cluster, p), offset in sorted(last.items())]
            self.lake.append(bronze(topic), rows, CommitProperties(app_transactions=txns))
            self.stats.rows[bronze(topic)] += len(records)
        self.stats.records += len(batch)

    def _refine_and_commit(self, batch: list[RawRecord]) -> None:
        seq = self.record.seq + 1
        with self.stats.timed("refine"):
            out = self.refiner.refine(batch, time.time(), seq)
        watermark = {t: {c: dict(parts) for c, parts in logs.items()} for t, logs in self.record.watermark.items()}
        for r in batch:
            parts = watermark.setdefault(r.topic, {}).setdefault(r.cluster, {})
            parts[r.partition] = max(parts.get(r.partition, -1), r.offset)
        self._commit(out, CommitRecord(seq, watermark, dict(self.record.versions)))

    def _release_expired(self) -> None:
        out = self.refiner.release_expired(time.time(), self.record.seq + 1)
        if out is not None:
            self._commit(out, CommitRecord(self.record.seq + 1, self.record.watermark, dict(self.record.versions)))

    def _commit(self, out: RefineOutput, record: CommitRecord) -> None:
        with self.stats.timed("commit"):
            self._write_derived(out, record)
        self.record = record
        self.stats.steps += 1
        # Counted where the step records it (silver/validations), so the summary and the table cannot disagree.
        self.stats.redeliveries += sum(
            json.loads(row["unexpected_counts"]).get("redelivery", 0) for row in out.rows[VALIDATIONS]
        )

    def _write_derived(self, out: RefineOutput, record: CommitRecord) -> None:
        for name in DERIVED_TABLES:
            if name == VALIDATIONS:
                continue
            rows = out.arrow(name)
            if rows is not None and rows.num_rows:
                record.versions[name] = self.lake.append(name, rows)
                self.stats.rows[name] += rows.num_rows
        # Written last, carrying the record, which must name the version this very commit will get.
        record.versions[VALIDATIONS] += 1
        written = self.lake.append(
            VALIDATIONS,
            pa.Table.from_pylist(out.rows[VALIDATIONS], SCHEMAS[VALIDATIONS]),
            CommitProperties(custom_metadata={COMMIT_RECORD_KEY: record.to_json()}),
        )
        if written != record.versions[VALIDATIONS]:
            raise LakeError(
                f"{VALIDATIONS} is at version {written}, expected {record.versions[VALIDATIONS]}: "
                "another process writes to this lake; run one ingestor per lake"
            )

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None
        if self.lease is not None:
            self.lease.release()
            self.lease = None


def lag(lake: Lake, bootstrap: str, topics: tuple[str, ...] = ALL_TOPICS, timeout_ms: int = 1000) -> int:
    """Records the cluster offers past what bronze holds (0: the lake has caught up with the log).

    Counted by reading from each partition's stored offset + 1, not from ListOffsets: Tansu 0.6
    answers "latest" with the base offset of the last record batch, not the log end."""
    cluster = cluster_id(bootstrap)
    consumer = assigned_consumer(bootstrap, topics, client_id="genenv-lag")
    try:
        for topic in topics:
            tps = partitions_of(consumer, topic)
            stored = stored_offsets(lake, cluster, topic, [tp.partition for tp in tps])
            for tp in tps:
                consumer.seek(tp, stored.get(tp.partition, -1) + 1)
        return sum(len(messages) for messages in consumer.poll(timeout_ms=timeout_ms).values())
    finally:
        consumer.close()


def ingest(
    lake: Lake,
    bootstrap: str,
    config: IngestConfig | None = None,
    idle_exit_s: float | None = None,
    stop=None,
    on_step=None,
    runner=None,
) -> IngestStats:
    """Run an ingestor until idle (or stopped) and return what it wrote."""
    ingestor = Ingestor(lake, bootstrap, config, runner=runner)
    try:
        return ingestor.run(idle_exit_s=idle_exit_s, stop=stop, on_step=on_step)
    finally:
        ingestor.close()
