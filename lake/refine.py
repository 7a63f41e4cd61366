"""Refine: raw Kafka records -> silver rows, quarantine rows and gold pool rows.

A refine step is a pure function of (records, state, clock): it never reads or
writes tables itself, so lake/ingest.py decides what commits when. The state
(ids seen, tasks known, rows waiting for their task, rows waiting for their
join partner) is derivable from the tables: `RefineState.load` rebuilds it on
start, so a restarted ingestor continues exactly where the last commit left.

Topics are not ordered against each other: a rollout or reward whose task has
not landed yet waits (at most `max_wait_s` seconds and `max_pending` rows, the
oldest released first) and is validated when its task lands or its wait ends;
only then does the reference check send it to quarantine.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import polars as pl

from streams.events import EVENT_TYPES, KIND_OF_TOPIC, TOPICS, EventDecodeError, field_types, parse_envelope

from .expectations import REFERS_TO_TASK, SuiteRunner
from .tables import CHECKPOINTS, D_ENV, D_TRAIN, QUARANTINE, VALIDATIONS, Lake, silver

log = logging.getLogger(__name__)

# The last offset refined, per topic, Kafka cluster and partition.
Watermark = dict[str, dict[str, dict[int, int]]]

KIND_ORDER = ("task", "rollout", "reward", "batch", "checkpoint")  # tasks first: they make references known


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
        return {"kafka_cluster": self.cluster, "kafka_partition": self.partition, "kafka_offset": self.offset, "kafka_timestamp": self.timestamp}


@dataclass
class Parsed:
    record: RawRecord
    kind: str
    payload: dict[str, Any]
    first_seen: float  # seconds since the epoch, when the ingestor first saw it


@dataclass
class RefineOutput:
    rows: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))

    def add(self, table: str, row: dict) -> None:
        self.rows[table].append(row)


@dataclass
class RefineState:
    seen_ids: dict[str, set[str]] = field(default_factory=lambda: {k: set() for k in EVENT_TYPES})
    known_tasks: set[str] = field(default_factory=set)
    pending: dict[tuple[str, int, int], Parsed] = field(default_factory=dict)  # insertion order = arrival
    rollouts_waiting: dict[str, dict] = field(default_factory=dict)  # rollout_id -> silver rollout row
    rewards_waiting: dict[str, dict] = field(default_factory=dict)  # rollout_id -> silver reward row
    tasks_waiting: dict[str, dict] = field(default_factory=dict)  # task_id -> silver task row
    batches_waiting: dict[str, dict] = field(default_factory=dict)  # task_id -> silver batch row

    @classmethod
    def load(cls, lake: Lake, watermark: Watermark) -> "RefineState":
        """Derive the state from the tables as they stand after the last refine commit."""
        state = cls()

        def scan(table: str) -> pl.LazyFrame:
            return pl.scan_delta(lake.uri(table))

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
            done = pl.concat([
                frame(silver(kind), coordinates),
                quarantined.filter(pl.col("topic") == topic).select(coordinates),
            ])
            held = (
                scan(f"bronze/{topic}").filter(refined(marks))
                .join(done.lazy(), on=coordinates, how="anti")
                .sort(coordinates).collect()
            )
            for row in held.iter_rows(named=True):
                record = bronze_record(row)
                _, payload = parse_envelope(record.value)
                state.pending[record.coordinates] = Parsed(record, kind, payload, row["ingested_at"].timestamp())
        return state


def refined(marks: dict[str, dict[int, int]]) -> pl.Expr:
    """Bronze rows at or before the refine watermark of their log (`marks`: cluster -> partition -> offset)."""
    terms = [
        (pl.col("kafka_cluster") == cluster) & (pl.col("kafka_partition") == p) & (pl.col("kafka_offset") <= o)
        for cluster, parts in marks.items() for p, o in parts.items()
    ]
    return pl.any_horizontal(terms) if terms else pl.lit(False)


def bronze_record(row: dict) -> RawRecord:
    return RawRecord(row["kafka_cluster"], row["topic"], row["kafka_partition"], row["kafka_offset"], row["kafka_timestamp"], row["key"], row["value"])


def _silver_row(kind: str, payload: dict, record: RawRecord) -> dict:
    row = {}
    for name, annotation in field_types(EVENT_TYPES[kind]).items():
        value = payload.get(name)
        if annotation is float and value is not None:
            value = float(value)
        elif annotation == list[float] and value is not None:
            value = [float(v) for v in value]
        row[name] = value
    row.update(record.kafka_columns())
    return row


def quarantine_row(record: RawRecord, reason: str, checks: list[str], payload: dict | None = None) -> dict:
    payload = payload or {}
    kind = KIND_OF_TOPIC.get(record.topic)
    return {
        "topic": record.topic,
        **record.kafka_columns(),
        "kind": kind,
        "event_id": payload.get("event_id") if isinstance(payload.get("event_id"), str) else None,
        "task_id": payload.get("task_id") if isinstance(payload.get("task_id"), str) else None,
        "reason": reason,
        "failed_checks": checks,
        "raw": record.value,
    }


def d_train_row(rollout: dict, reward: dict) -> dict:
    return {
        "rollout_id": rollout["rollout_id"], "task_id": rollout["task_id"], "run_id": rollout["run_id"],
        "epoch": rollout["epoch"], "group_index": rollout["group_index"],
        "agent_model_version": rollout["agent_model_version"], "prompt": rollout["prompt"],
        "completion": rollout["completion"], "completion_token_ids": rollout["completion_token_ids"],
        "behaviour_logprobs": rollout["behaviour_logprobs"], "reward": reward["reward"],
        "success": reward["success"], "checker_detail": reward["checker_detail"],
        "rollout_event_id": rollout["event_id"], "reward_event_id": reward["event_id"],
    }


def d_env_row(task: dict, batch: dict) -> dict:
    return {
        "task_id": task["task_id"], "batch_id": batch["batch_id"], "run_id": task["run_id"], "epoch": task["epoch"],
        "domain": task["domain"], "env_model_version": task["env_model_version"], "sim_prompt": task["sim_prompt"],
        "raw_generation": task["raw_generation"], "task_prompt": task["task_prompt"], "valid": task["valid"],
        "difficulty_json": task["difficulty_json"], "granularity": batch["granularity"], "p_hat": batch["p_hat"],
        "env_reward": batch["env_reward"], "weight": batch["weight"], "filtered": batch["filtered"],
        "task_event_id": task["event_id"], "batch_event_id": batch["event_id"],
    }


class Refiner:
    def __init__(self, state: RefineState, runner: SuiteRunner | None = None,
                 max_wait_s: float = 30.0, max_pending: int = 100_000):
        self.state = state
        self.runner = runner or SuiteRunner()
        self.max_wait_s = max_wait_s
        self.max_pending = max_pending

    # -- entry points -------------------------------------------------------------------------
    def refine(self, records: list[RawRecord], now: float, seq: int) -> RefineOutput:
        out = RefineOutput()
        by_kind: dict[str, list[Parsed]] = defaultdict(list)
        for record in records:
            try:
                cls, payload = parse_envelope(record.value)
            except EventDecodeError as exc:
                out.add(QUARANTINE, quarantine_row(record, str(exc)[:500], [exc.check]))
                continue
            if cls.TOPIC != record.topic:
                reason = f"wrong_topic: a {cls.KIND} event on {record.topic} (expected {cls.TOPIC})"
                out.add(QUARANTINE, quarantine_row(record, reason, ["wrong_topic"], payload))
                continue
            by_kind[cls.KIND].append(Parsed(record, cls.KIND, payload, now))
        decoded = sum(len(v) for v in by_kind.values())
        out.add(VALIDATIONS, self._validation_row(seq, "envelope", "genenv.envelope", len(records), decoded,
                                                  {"parse_envelope": len(records) - decoded}, now))
        for kind in KIND_ORDER:
            ready = by_kind.get(kind, [])
            if kind in REFERS_TO_TASK:
                ready = self._hold_back(kind, ready, now)
            if ready:
                self._validate(kind, ready, out, seq, now)
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
        for coordinates, parsed in list(pending.items()):  # only rows with a str task_id ever wait
            if parsed.kind == kind and (parsed.payload["task_id"] in known or now - parsed.first_seen > self.max_wait_s):
                ready.append(pending.pop(coordinates))
        for parsed in arriving:
            task_id = parsed.payload.get("task_id")
            if isinstance(task_id, str) and task_id not in known:
                pending[parsed.record.coordinates] = parsed
            else:
                ready.append(parsed)
        while len(pending) > self.max_pending:
            oldest = next(iter(pending))
            if pending[oldest].kind != kind:
                break  # released with its own kind's step
            ready.append(pending.pop(oldest))
        return ready

    def _validate(self, kind: str, rows: list[Parsed], out: RefineOutput, seq: int, now: float) -> None:
        runner, state = self.runner, self.state
        seen, in_batch, duplicate = state.seen_ids[kind], set(), []
        for parsed in rows:
            event_id = parsed.payload.get("event_id")
            if not isinstance(event_id, str):  # absent or mistyped (maybe unhashable): the shape checks report it
                duplicate.append(False)
                continue
            duplicate.append(event_id in seen or event_id in in_batch)
            in_batch.add(event_id)
        frame = runner.frame(kind, [p.payload for p in rows], duplicate)
        unknown = None
        if kind in REFERS_TO_TASK:
            unknown = sorted({t for t in frame["task_id"] if isinstance(t, str) and t not in state.known_tasks})
        verdict = runner.run(kind, frame, runner.suite(kind, unknown))
        failed = verdict.failed
        passed_rows = []
        for i, parsed in enumerate(rows):
            if i in failed:
                out.add(QUARANTINE, quarantine_row(parsed.record, failed[i][0], failed[i], parsed.payload))
            else:
                passed_rows.append(_silver_row(kind, parsed.payload, parsed.record))
        for row in passed_rows:
            seen.add(row["event_id"])
            out.add(silver(kind), row)
        if kind == "task":
            state.known_tasks.update(row["task_id"] for row in passed_rows)
        out.add(VALIDATIONS, self._validation_row(seq, kind, f"genenv.{kind}", len(rows), len(passed_rows),
                                                  dict(verdict.unexpected_counts), now))
        self._to_gold(kind, passed_rows, out)

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
                join(row["rollout_id"], row, state.rewards_waiting, state.rollouts_waiting, D_TRAIN,
                     lambda reward, rollout: d_train_row(rollout, reward))
            elif kind == "task":
                join(row["task_id"], row, state.tasks_waiting, state.batches_waiting, D_ENV, d_env_row)
            elif kind == "batch":
                for task_id in row["task_ids"]:
                    join(task_id, row, state.batches_waiting, state.tasks_waiting, D_ENV,
                         lambda batch, task: d_env_row(task, batch))
            elif kind == "checkpoint":
                out.add(CHECKPOINTS, {k: v for k, v in row.items() if not k.startswith("kafka_")})

    @staticmethod
    def _validation_row(seq: int, kind: str, suite: str, rows: int, passed: int, counts: dict, now: float) -> dict:
        return {
            "refine_seq": seq, "kind": kind, "suite": suite, "rows": rows, "passed": passed,
            "failed": rows - passed, "unexpected_counts": json.dumps(counts, sort_keys=True),
            "success": passed == rows, "validated_at": datetime.fromtimestamp(now, tz=timezone.utc),
        }
