"""Refine: raw Kafka records -> silver rows, quarantine rows and gold pool rows.

A refine step is a pure function of (records, state, clock): it never reads or
writes tables itself, so lake/ingest.py decides what commits when. The state
(ids seen, tasks known, rows waiting for their task, rows waiting for their
join partner) is derivable from the tables: `RefineState.load` rebuilds it on
start, so a restarted ingestor continues exactly where the last commit left.

Topics are not ordered against each other: a rollout or reward whose task has
not landed yet waits (at most `max_wait_s` seconds and `max_pending` rows, the
oldest released first) and is validated when its task lands or its wait ends;
only then does the reference check send it to quarantine. Late is not wrong: a
row quarantined for that check alone (LATE_CHECK) is kept, and re-admitted into
silver when its task lands, in the same step as the task (its quarantine row
stays, so the lake shows both; `late` in the state, rebuilt from the quarantine
on start, bounded by `max_pending`). A restarted ingestor gives the rows it finds
waiting a whole new wait, from its start.

No record can stop a step (docs/EVENTS.md): each is decoded on its own (the event contract,
streams/events.py), a suite that cannot be evaluated on a frame is run on its halves until the rows
that break it are isolated, and every silver row is proven to fit its Arrow schema before the step
counts it as landed. What fails goes to silver/quarantine with the reason and the raw bytes; the
rest of its micro-batch lands. A second copy of a landed event is a redelivery when its content
(every field but produced_at) is the same, dropped and counted in silver/validations, and a
conflicting duplicate otherwise, quarantined: the first copy always stays.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa

from streams.events import (
    EVENT_TYPES,
    KIND_OF_TOPIC,
    TOPICS,
    Event,
    EventDecodeError,
    content_digest,
    decode,
    field_types,
)

from .expectations import LATE_CHECK, MAX_ID_CHARS, REFERS_TO_TASK, SuiteRunner, late_only
from .registry import registry_refusal
from .storage import LakeFiles
from .tables import CHECKPOINTS, D_ENV, D_TRAIN, QUARANTINE, SCHEMAS, VALIDATIONS, Lake, silver

log = logging.getLogger(__name__)

# The last offset refined, per topic, Kafka cluster and partition.
Watermark = dict[str, dict[str, dict[int, int]]]

KIND_ORDER = ("task", *(k for k in EVENT_TYPES if k != "task"))  # tasks first: they make references known; every kind


@dataclass(frozen=True)
class RawRecord:
    cluster: str  # the Kafka cluster id: offsets restart in a new cluster
    topic: str
    partition: int
    offset: int
    timestamp: int  # Kafka timestamp, ms
    key: bytes | None
    value: bytes | None

    @property
    def coordinates(self) -> tuple[str, str, int, int]:
        return (self.cluster, self.topic, self.partition, self.offset)

    def kafka_columns(self) -> dict:
        return {
            "kafka_cluster": self.cluster,
            "kafka_partition": self.partition,
            "kafka_offset": self.offset,
            "kafka_timestamp": self.timestamp,
        }


@dataclass
class Parsed:
    record: RawRecord
    event: Event
    first_seen: float  # seconds since the epoch, when the ingestor first saw it

    @property
    def kind(self) -> str:
        return self.event.KIND


@dataclass
class RefineOutput:
    rows: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    tables: dict[str, list[pa.Table]] = field(default_factory=lambda: defaultdict(list))  # silver, already converted

    def add(self, table: str, row: dict) -> None:
        self.rows[table].append(row)

    def arrow(self, table: str) -> pa.Table | None:
        """Everything the step writes to `table`, as one Arrow table (None: nothing)."""
        parts = list(self.tables.get(table, []))
        if self.rows.get(table):
            parts.append(pa.Table.from_pylist(self.rows[table], SCHEMAS[table]))
        return pa.concat_tables(parts) if parts else None


# (kind, event ids) -> {event id: content digest} of those that landed in silver in earlier steps.
LandedDigests = Callable[[str, list[str]], dict[str, str]]


@dataclass
class RefineState:
    seen_ids: dict[str, set[str]] = field(default_factory=lambda: {k: set() for k in EVENT_TYPES})
    known_tasks: set[str] = field(default_factory=set)
    pending: dict[tuple[str, int, int], Parsed] = field(default_factory=dict)  # insertion order = arrival
    late: dict[tuple[str, int, int], Parsed] = field(default_factory=dict)  # quarantined before their task landed
    rollouts_waiting: dict[str, dict] = field(default_factory=dict)  # rollout_id -> silver rollout row
    rewards_waiting: dict[str, dict] = field(default_factory=dict)  # rollout_id -> silver reward row
    tasks_waiting: dict[str, dict] = field(default_factory=dict)  # task_id -> silver task row
    batches_waiting: dict[str, dict] = field(default_factory=dict)  # task_id -> silver batch row
    registered: set[tuple[str, int]] = field(default_factory=set)  # (model_kind, version) in the registry

    @classmethod
    def load(cls, lake: Lake, watermark: Watermark, now: float | None = None, max_late: int = 100_000) -> RefineState:
        """Derive the state from the tables as they stand after the last refine commit. now: when the rows found
        waiting for their task start their wait again (default: the clock; bronze's ingested_at would expire them
        at once after a long stop). max_late: how many late rows (the last by Kafka coordinates) are kept for
        re-admission."""
        state = cls()
        now = time.time() if now is None else now

        def scan(table: str) -> pl.LazyFrame:
            return lake.scan(table)

        def frame(table: str, columns: list[str]) -> pl.DataFrame:
            return scan(table).select(columns).collect()

        def waiting(table: str, key: str, pool: str) -> pl.DataFrame:
            """Rows of a silver table whose key is not in the pool yet (lazy: only those rows are loaded)."""
            return scan(table).join(scan(pool).select(key).unique(), on=key, how="anti").collect()

        for kind in EVENT_TYPES:
            ids = frame(silver(kind), ["event_id", "task_id"] if kind == "task" else ["event_id"])
            state.seen_ids[kind] = set(ids["event_id"].to_list())
            if kind == "task":
                state.known_tasks = set(ids["task_id"].to_list())
        for row in waiting(silver("rollout"), "rollout_id", D_TRAIN).iter_rows(named=True):
            state.rollouts_waiting[row["rollout_id"]] = row
        for row in waiting(silver("reward"), "rollout_id", D_TRAIN).iter_rows(named=True):
            state.rewards_waiting[row["rollout_id"]] = row
        for row in waiting(silver("task"), "task_id", D_ENV).iter_rows(named=True):
            state.tasks_waiting[row["task_id"]] = row
        state.registered = set(frame(CHECKPOINTS, ["model_kind", "version"]).iter_rows())
        in_d_env = set(frame(D_ENV, ["task_id"])["task_id"].to_list())
        for row in scan(silver("batch")).collect().iter_rows(named=True):  # one row per batch: small
            for task_id in row["task_ids"]:
                if task_id not in in_d_env and task_id not in state.tasks_waiting:
                    state.batches_waiting[task_id] = row

        # Rows waiting for their task: in bronze (up to the watermark) but neither in silver nor in quarantine.
        coordinates = ["kafka_cluster", "kafka_partition", "kafka_offset"]
        quarantined = frame(QUARANTINE, ["topic", *coordinates])
        for kind in REFERS_TO_TASK:
            topic = TOPICS[kind]
            marks = watermark.get(topic, {})
            if not marks:
                continue
            done = pl.concat(
                [
                    frame(silver(kind), coordinates),
                    quarantined.filter(pl.col("topic") == topic).select(coordinates),
                ]
            )
            held = (
                scan(f"bronze/{topic}")
                .filter(refined(marks))
                .join(done.lazy(), on=coordinates, how="anti")
                .sort(coordinates)
                .collect()
            )
            for row in held.iter_rows(named=True):
                record = bronze_record(row)
                try:
                    event = decode(record.value)
                except Exception:  # noqa: BLE001 (it was quarantined, not held; never let it stop a start)
                    continue
                if event.event_id in state.seen_ids[kind]:
                    continue  # a redelivery: dropped when it was refined
                state.pending[record.coordinates] = Parsed(record, event, now)

        # Late rows: quarantined for their task alone, and not in silver since.
        late = (
            scan(QUARANTINE)
            .filter(pl.col("kind").is_in(list(REFERS_TO_TASK)) & late_only())
            .sort(["kafka_cluster", "topic", "kafka_partition", "kafka_offset"])
            .tail(max_late)
            .collect()
        )
        for row in late.iter_rows(named=True):
            record = RawRecord(
                row["kafka_cluster"], row["topic"], row["kafka_partition"], row["kafka_offset"],
                row["kafka_timestamp"], None, row["raw"],
            )  # fmt: skip
            try:
                event = decode(record.value)
            except Exception:  # noqa: BLE001 (it decoded once; never let it stop a start)
                continue
            if event.event_id not in state.seen_ids[event.KIND]:
                state.late[record.coordinates] = Parsed(record, event, now)
        return state


def refined(marks: dict[str, dict[int, int]]) -> pl.Expr:
    """Bronze rows at or before the refine watermark of their log (`marks`: cluster -> partition -> offset)."""
    terms = [
        (pl.col("kafka_cluster") == cluster) & (pl.col("kafka_partition") == p) & (pl.col("kafka_offset") <= o)
        for cluster, parts in marks.items()
        for p, o in parts.items()
    ]
    return pl.any_horizontal(terms) if terms else pl.lit(False)


def bronze_record(row: dict) -> RawRecord:
    return RawRecord(
        row["kafka_cluster"],
        row["topic"],
        row["kafka_partition"],
        row["kafka_offset"],
        row["kafka_timestamp"],
        row["key"],
        row["value"],
    )


def _silver_row(event: Event, record: RawRecord) -> dict:
    return {**{name: getattr(event, name) for name in field_types(type(event))}, **record.kafka_columns()}


def _safe_text(value: Any, limit: int) -> str | None:
    """A producer's string as a quarantine row can hold it: valid UTF-8 and at most `limit` characters."""
    if type(value) is not str or not value or len(value) > limit:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def quarantine_row(record: RawRecord, reason: str, checks: list[str], payload: dict | Event | None = None) -> dict:
    """A quarantine row: where the record came from, why, and its raw bytes; ids only where they are safe text."""
    if isinstance(payload, Event):
        payload = {"event_id": payload.event_id, "task_id": getattr(payload, "task_id", None)}
    payload = payload or {}
    return {
        "topic": record.topic,
        **record.kafka_columns(),
        "kind": KIND_OF_TOPIC.get(record.topic),
        "event_id": _safe_text(payload.get("event_id"), MAX_ID_CHARS),
        "task_id": _safe_text(payload.get("task_id"), MAX_ID_CHARS),
        "reason": reason.encode("utf-8", "backslashreplace").decode()[:500],
        "failed_checks": [c.encode("utf-8", "backslashreplace").decode()[:200] for c in checks],
        "raw": record.value,
    }


def d_train_row(rollout: dict, reward: dict) -> dict:
    return {
        "rollout_id": rollout["rollout_id"],
        "task_id": rollout["task_id"],
        "run_id": rollout["run_id"],
        "epoch": rollout["epoch"],
        "group_index": rollout["group_index"],
        "agent_model_version": rollout["agent_model_version"],
        "prompt": rollout["prompt"],
        "completion": rollout["completion"],
        "completion_token_ids": rollout["completion_token_ids"],
        "behaviour_logprobs": rollout["behaviour_logprobs"],
        "temperature": rollout.get("temperature"),
        "turns_json": rollout.get("turns_json") or "[]",
        "reward": reward["reward"],
        "success": reward["success"],
        "checker_detail": reward["checker_detail"],
        "rollout_event_id": rollout["event_id"],
        "reward_event_id": reward["event_id"],
    }


def d_env_row(task: dict, batch: dict) -> dict:
    return {
        "task_id": task["task_id"],
        "batch_id": batch["batch_id"],
        "run_id": task["run_id"],
        "epoch": task["epoch"],
        "domain": task["domain"],
        "env_model_version": task["env_model_version"],
        "sim_prompt": task["sim_prompt"],
        "raw_generation": task["raw_generation"],
        "temperature": task.get("temperature"),
        "task_prompt": task["task_prompt"],
        "valid": task["valid"],
        "difficulty_json": task["difficulty_json"],
        "granularity": batch["granularity"],
        "p_hat": batch["p_hat"],
        "env_reward": batch["env_reward"],
        "weight": batch["weight"],
        "filtered": batch["filtered"],
        "task_event_id": task["event_id"],
        "batch_event_id": batch["event_id"],
    }


class Refiner:
    def __init__(
        self,
        state: RefineState,
        runner: SuiteRunner | None = None,
        max_wait_s: float = 30.0,
        max_pending: int = 100_000,
        landed_digests: LandedDigests | None = None,
        checkpoint_files: LakeFiles | None = None,
    ):
        self.state = state
        self.runner = runner or SuiteRunner()
        self.max_wait_s = max_wait_s
        self.max_pending = max_pending
        self.landed_digests = landed_digests or (lambda kind, ids: {})
        self.checkpoint_files = checkpoint_files  # the lake whose checkpoints/ folder a CheckpointPublished must name
        self.verified: dict[tuple, tuple[str, str] | None] = {}  # verify(): the next step's checkpoint verdicts

    # -- entry points -------------------------------------------------------------------------
    def refine(self, records: list[RawRecord], now: float, seq: int) -> RefineOutput:
        out = RefineOutput()
        by_kind: dict[str, list[Parsed]] = defaultdict(list)
        refused: Counter = Counter()
        for record in records:
            try:
                event = decode(record.value)
            except EventDecodeError as exc:
                out.add(QUARANTINE, quarantine_row(record, str(exc), [exc.check], exc.payload))
                refused[exc.check.partition(":")[0]] += 1
                continue
            except Exception as exc:  # noqa: BLE001 (a record must never stop the ingestor; decode has a bug)
                log.exception("decoding %s failed", record.coordinates)
                out.add(
                    QUARANTINE,
                    quarantine_row(record, f"decode_error: {exc.__class__.__name__}: {exc}"[:500], ["decode_error"]),
                )
                refused["decode_error"] += 1
                continue
            if event.TOPIC != record.topic:
                reason = f"wrong_topic: a {event.KIND} event on {record.topic} (expected {event.TOPIC})"
                out.add(QUARANTINE, quarantine_row(record, reason, ["wrong_topic"], event))
                refused["wrong_topic"] += 1
                continue
            by_kind[event.KIND].append(Parsed(record, event, now))
        decoded = sum(len(v) for v in by_kind.values())
        out.add(
            VALIDATIONS,
            self._validation_row(seq, "envelope", "genenv.contract", len(records), decoded, dict(refused), now),
        )
        for kind in KIND_ORDER:
            ready = by_kind.get(kind, [])
            if kind in REFERS_TO_TASK:
                ready = self._hold_back(kind, ready, now)
            if ready:
                self._validate(kind, ready, out, seq, now)
        self.verified.clear()
        return out

    def release_expired(self, now: float, seq: int) -> RefineOutput | None:
        """Validate rows whose wait for their task is over (called when the topics are idle)."""
        if not any(now - p.first_seen > self.max_wait_s for p in self.state.pending.values()):
            return None
        out = RefineOutput()
        for kind in KIND_ORDER:
            if kind in REFERS_TO_TASK:
                ready = self._hold_back(kind, [], now)
                if ready:
                    self._validate(kind, ready, out, seq, now)
        return out

    # -- steps --------------------------------------------------------------------------------
    def _hold_back(self, kind: str, arriving: list[Parsed], now: float) -> list[Parsed]:
        """Rows of `kind` to validate now; the rest wait in state.pending for their task."""
        pending, known = self.state.pending, self.state.known_tasks
        ready = []
        for coordinates, parsed in list(pending.items()):
            if parsed.kind == kind and (parsed.event.task_id in known or now - parsed.first_seen > self.max_wait_s):
                ready.append(pending.pop(coordinates))
        for parsed in arriving:
            if parsed.event.task_id not in known:
                pending[parsed.record.coordinates] = parsed
            else:
                ready.append(parsed)
        while len(pending) > self.max_pending:
            oldest = next(iter(pending))
            if pending[oldest].kind != kind:
                break  # released with its own kind's step
            ready.append(pending.pop(oldest))
        return ready

    def _validate(
        self, kind: str, rows: list[Parsed], out: RefineOutput, seq: int, now: float, suite: str | None = None
    ) -> None:
        """The content suite, then first copies only and (checkpoints) the registry's rules, then the Arrow proof:
        what fails any of them goes to the quarantine, the rest lands in silver and on to gold."""
        state = self.state
        unknown = None
        if kind in REFERS_TO_TASK:
            unknown = sorted({p.event.task_id for p in rows if p.event.task_id not in state.known_tasks})
        failed, counts = self._verdict(kind, [p.event for p in rows], unknown)
        for i, (reason, checks) in failed.items():
            out.add(QUARANTINE, quarantine_row(rows[i].record, reason, checks, rows[i].event))
            if checks == [LATE_CHECK]:
                self._keep_late(rows[i])
        landing = self._landing(kind, [p for i, p in enumerate(rows) if i not in failed], out, counts)
        silver_rows = self._arrow_proof(kind, landing, out, counts)
        state.seen_ids[kind].update(row["event_id"] for row in silver_rows)
        if kind == "task":
            state.known_tasks.update(row["task_id"] for row in silver_rows)
        out.add(
            VALIDATIONS,
            self._validation_row(seq, kind, suite or f"genenv.{kind}", len(rows), len(silver_rows), dict(counts), now),
        )
        self._to_gold(kind, silver_rows, out)
        if kind == "task":
            self._readmit([row["task_id"] for row in silver_rows], out, seq, now)

    def _keep_late(self, parsed: Parsed) -> None:
        """Remember a row quarantined only because its task had not landed (the oldest forgotten past max_pending:
        it stays in the quarantine, and a restart finds it there again)."""
        late = self.state.late
        late[parsed.record.coordinates] = parsed
        while len(late) > self.max_pending:
            del late[next(iter(late))]

    def _readmit(self, task_ids: list[str], out: RefineOutput, seq: int, now: float) -> None:
        """The late rows of tasks that just landed, validated again (suite genenv.<kind>.late in silver/validations):
        their task is known now, so what failed only for it lands in silver and on to the pools."""
        late, landed = self.state.late, set(task_ids)
        if not late or not landed:
            return
        back = [late.pop(c) for c, p in list(late.items()) if p.event.task_id in landed]  # as _hold_back scans pending
        for kind in KIND_ORDER:
            rows = [p for p in back if p.kind == kind]
            if rows:
                self._validate(kind, rows, out, seq, now, suite=f"genenv.{kind}.late")

    def _verdict(
        self, kind: str, events: list[Event], unknown: list[str] | None
    ) -> tuple[dict[int, tuple[str, list[str]]], Counter]:
        """Row position -> (reason, failed checks), and counts per check. A suite that cannot be evaluated on
        the frame is run on each half, down to single rows, so only the rows that break it are refused."""
        runner = self.runner
        try:
            verdict = runner.run(kind, runner.frame(kind, events), runner.suite(kind, unknown))
        except Exception as exc:  # noqa: BLE001 (SuiteError, or anything pandas/GX raise on a frame)
            if len(events) == 1:
                return {0: (f"suite_error: {exc.__class__.__name__}: {exc}"[:500], ["suite_error"])}, Counter(
                    suite_error=1
                )
            half = len(events) // 2
            failed, counts = self._verdict(kind, events[:half], unknown)
            more, more_counts = self._verdict(kind, events[half:], unknown)
            failed.update({half + i: v for i, v in more.items()})
            return failed, counts + more_counts
        return {i: (checks[0], checks) for i, checks in verdict.failed.items()}, Counter(verdict.unexpected_counts)

    def _landing(self, kind: str, rows: list[Parsed], out: RefineOutput, counts: Counter) -> list[Parsed]:
        """The rows that may land, in order: the first copy of each event id (a later copy is a redelivery when its
        content is the same, dropped and counted, and a conflicting duplicate otherwise, quarantined) and, for
        checkpoints, only those the registry takes (lake/registry.py). A copy that is refused does not count as
        the first: the next copy of its id gets its chance."""
        seen = self.state.seen_ids[kind]
        earlier = self.landed_digests(kind, sorted({p.event.event_id for p in rows if p.event.event_id in seen}))
        first: dict[str, Event] = {}  # event id -> the copy landing in this step (digests only on a collision)
        kept = []
        for parsed in rows:
            event = parsed.event
            if event.event_id in first or event.event_id in seen:
                landed = first.get(event.event_id)
                original = content_digest(dataclasses.asdict(landed)) if landed else earlier.get(event.event_id)
                if content_digest(dataclasses.asdict(event)) == original:
                    counts["redelivery"] += 1
                else:
                    reason = "conflicting_duplicate: an event with this event_id and other content landed first"
                    out.add(QUARANTINE, quarantine_row(parsed.record, reason, ["conflicting_duplicate"], event))
                    counts["conflicting_duplicate"] += 1
                continue
            refusal = self._registry_refusal(event) if kind == "checkpoint" else None
            if refusal is not None:
                out.add(QUARANTINE, quarantine_row(parsed.record, refusal[1], [refusal[0]], event))
                counts[refusal[0]] += 1
                continue
            if kind == "checkpoint":
                self.state.registered.add((event.model_kind, event.version))
            first[event.event_id] = event
            kept.append(parsed)
        return kept

    def _registry_refusal(self, event) -> tuple[str, str] | None:
        if (event.model_kind, event.version) in self.state.registered:
            return (
                "registry_version_taken",
                f"registry_version_taken: {event.model_kind} v{event.version} is already registered",
            )
        key = (event.model_kind, event.version, event.path, event.sha256)
        if key in self.verified:
            return self.verified[key]
        return self.files_refusal(event)

    def verify(self, event) -> None:
        """Hash the weights a CheckpointPublished names ahead of the step that refines it (the ingestor does, with
        its lease kept alive: a large checkpoint takes longer to hash than a lease lasts); the step looks it up."""
        self.verified[(event.model_kind, event.version, event.path, event.sha256)] = self.files_refusal(event)

    def files_refusal(self, event) -> tuple[str, str] | None:
        if self.checkpoint_files is None:
            return "registry_files", "registry_files: this ingestor has no lake to find checkpoints in"
        return registry_refusal(self.checkpoint_files, event.model_kind, event.version, event.path, event.sha256)

    @staticmethod
    def _arrow_proof(kind: str, landing: list[Parsed], out: RefineOutput, counts: Counter) -> list[dict]:
        """The silver rows of `landing` that convert to the table's Arrow schema (all of them, unless the
        contract has a hole); the others are quarantined. The converted table is what the step writes."""
        rows = [_silver_row(p.event, p.record) for p in landing]
        schema = SCHEMAS[silver(kind)]
        try:
            out.tables[silver(kind)].append(pa.Table.from_pylist(rows, schema))
            return rows
        except Exception:  # noqa: BLE001 (isolate the rows below)
            pass
        kept = []
        for parsed, row in zip(landing, rows):
            try:
                out.tables[silver(kind)].append(pa.Table.from_pylist([row], schema))
                kept.append(row)
            except Exception as exc:  # noqa: BLE001
                reason = f"arrow: {exc.__class__.__name__}: {exc}"[:500]
                out.add(QUARANTINE, quarantine_row(parsed.record, reason, ["arrow"], parsed.event))
                counts["arrow"] += 1
        return kept

    def _to_gold(self, kind: str, rows: list[dict], out: RefineOutput) -> None:
        """Join each new silver row with its partner if it has landed, else leave it waiting for it."""
        state = self.state

        def join(key, row, mine, theirs, table, build):
            partner = theirs.pop(key, None)
            if partner is None:
                mine[key] = row
            else:
                out.add(table, build(row, partner))

        for row in rows:
            if kind == "rollout":
                join(row["rollout_id"], row, state.rollouts_waiting, state.rewards_waiting, D_TRAIN, d_train_row)
            elif kind == "reward":
                join(
                    row["rollout_id"],
                    row,
                    state.rewards_waiting,
                    state.rollouts_waiting,
                    D_TRAIN,
                    lambda reward, rollout: d_train_row(rollout, reward),
                )
            elif kind == "task":
                join(row["task_id"], row, state.tasks_waiting, state.batches_waiting, D_ENV, d_env_row)
            elif kind == "batch":
                for task_id in row["task_ids"]:
                    join(
                        task_id,
                        row,
                        state.batches_waiting,
                        state.tasks_waiting,
                        D_ENV,
                        lambda batch, task: d_env_row(task, batch),
                    )
            elif kind == "checkpoint":
                out.add(CHECKPOINTS, {k: v for k, v in row.items() if not k.startswith("kafka_")})

    @staticmethod
    def _validation_row(seq: int, kind: str, suite: str, rows: int, passed: int, counts: dict, now: float) -> dict:
        return {
            "refine_seq": seq,
            "kind": kind,
            "suite": suite,
            "rows": rows,
            "passed": passed,
            "failed": rows - passed,
            "unexpected_counts": json.dumps(counts, sort_keys=True),
            "success": passed == rows,
            "validated_at": datetime.fromtimestamp(now, tz=UTC),
        }
