"""The five kinds of event that flow through Kafka, and their JSON encoding.

Invariants:
- One event is one flat JSON object (scalars and lists of scalars; structured
  payloads such as tool schemas travel as JSON strings), so every kind maps onto
  one typed Delta table without guessing.
- `schema` is "genenv.<kind>/<version>"; a decoder refuses any kind or version
  it does not know, naming it.
- `event_id` is a hash of the event's identity (kind, run, epoch and its own
  ids), never of its timestamp or free text, so replaying a run yields the same
  ids and duplicates are recognisable.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

SCHEMA_VERSION = 1


class EventDecodeError(ValueError):
    """A payload that is not a well-formed genenv event. `check` names what failed."""

    def __init__(self, check: str, message: str):
        super().__init__(f"{check}: {message}")
        self.check = check


@dataclass(frozen=True, kw_only=True)
class Event:
    KIND: ClassVar[str] = ""
    TOPIC: ClassVar[str] = ""
    IDENTITY: ClassVar[tuple[str, ...]] = ()

    run_id: str
    epoch: int
    producer: str = "genenv"
    produced_at: float = field(default_factory=time.time)
    event_id: str = ""
    schema: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema", f"genenv.{self.KIND}/{SCHEMA_VERSION}")
        if not self.event_id:
            object.__setattr__(self, "event_id", self.identity_hash())

    def identity_hash(self) -> str:
        parts = [self.KIND, self.run_id, str(self.epoch)] + [str(getattr(self, f)) for f in self.IDENTITY]
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]

    @property
    def key(self) -> str:
        """Kafka key: the task id where there is one, so a task's events share a partition."""
        return str(getattr(self, "task_id", None) or getattr(self, self.IDENTITY[0]))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True, kw_only=True)
class TaskGenerated(Event):
    KIND: ClassVar[str] = "task"
    TOPIC: ClassVar[str] = "genenv.tasks"
    IDENTITY: ClassVar[tuple[str, ...]] = ("task_id",)

    task_id: str
    batch_id: str
    domain: str
    env_model_version: str
    sim_prompt: str
    raw_generation: str
    task_prompt: str = ""
    tools_json: str = "[]"
    reference_json: str = "null"
    difficulty_json: str = "{}"
    valid: bool = True
    invalid_reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class RolloutCompleted(Event):
    KIND: ClassVar[str] = "rollout"
    TOPIC: ClassVar[str] = "genenv.rollouts"
    IDENTITY: ClassVar[tuple[str, ...]] = ("rollout_id",)

    rollout_id: str
    task_id: str
    group_index: int
    agent_model_version: str
    prompt: str
    completion: str
    completion_token_ids: list[int] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)
    turns_json: str = "[]"


@dataclass(frozen=True, kw_only=True)
class RewardScored(Event):
    KIND: ClassVar[str] = "reward"
    TOPIC: ClassVar[str] = "genenv.rewards"
    IDENTITY: ClassVar[tuple[str, ...]] = ("rollout_id",)

    rollout_id: str
    task_id: str
    reward: float
    success: bool
    checker_detail: str = ""


@dataclass(frozen=True, kw_only=True)
class BatchScored(Event):
    KIND: ClassVar[str] = "batch"
    TOPIC: ClassVar[str] = "genenv.batches"
    IDENTITY: ClassVar[tuple[str, ...]] = ("batch_id",)

    batch_id: str
    task_ids: list[str]
    granularity: str
    p_hat: float
    env_reward: float
    weight: float
    filtered: bool
    n_tasks: int
    n_rollouts: int
    n_success: int


@dataclass(frozen=True, kw_only=True)
class CheckpointPublished(Event):
    KIND: ClassVar[str] = "checkpoint"
    TOPIC: ClassVar[str] = "genenv.checkpoints"
    IDENTITY: ClassVar[tuple[str, ...]] = ("model_kind", "version")

    model_kind: str
    version: int
    parent_version: int | None
    path: str
    sha256: str
    pool_table: str
    pool_version: int
    config_hash: str
    seed: int
    metrics_json: str = "{}"

    @property
    def key(self) -> str:
        return self.model_kind


EVENT_TYPES: dict[str, type[Event]] = {
    cls.KIND: cls for cls in (TaskGenerated, RolloutCompleted, RewardScored, BatchScored, CheckpointPublished)
}
TOPICS: dict[str, str] = {kind: cls.TOPIC for kind, cls in EVENT_TYPES.items()}
KIND_OF_TOPIC: dict[str, str] = {topic: kind for kind, topic in TOPICS.items()}


@functools.cache
def field_types(cls: type[Event]) -> dict[str, Any]:
    """Field name -> resolved type annotation, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


@functools.cache
def required_fields(cls: type[Event]) -> tuple[str, ...]:
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )


def parse_envelope(raw: bytes | str | None) -> tuple[type[Event], dict[str, Any]]:
    """Parse bytes into (event class, payload dict), checking only JSON and schema.

    Field presence and types are left to the caller (the lake checks them with
    Great Expectations so that a failure is recorded, not raised)."""
    if raw is None:
        raise EventDecodeError("not_json", "empty message value")
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EventDecodeError("not_json", f"value is not JSON ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(payload, dict):
        raise EventDecodeError("not_json_object", f"value is a JSON {type(payload).__name__}, not an object")
    schema = payload.get("schema")
    if not isinstance(schema, str) or not schema.startswith("genenv.") or "/" not in schema:
        raise EventDecodeError("unknown_schema", f"missing or malformed schema field {schema!r}")
    kind, _, version = schema[len("genenv."):].partition("/")
    if kind not in EVENT_TYPES:
        raise EventDecodeError("unknown_schema", f"unknown event kind {kind!r} in schema {schema!r}")
    if version != str(SCHEMA_VERSION):
        raise EventDecodeError(
            "unknown_schema", f"unsupported schema version {version!r} in {schema!r} (this build reads /{SCHEMA_VERSION})"
        )
    return EVENT_TYPES[kind], payload


def matches_type(value: Any, annotation: Any) -> bool:
    """Whether a decoded JSON value has the field's declared type (an int is a float; a bool is not an int)."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return any(matches_type(value, arm) for arm in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(annotation)
        return isinstance(value, list) and all(matches_type(v, item) for v in value)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def decode(raw: bytes | str | None) -> Event:
    """Strict decoding into a typed event; raises EventDecodeError naming the first problem."""
    cls, payload = parse_envelope(raw)
    hints = field_types(cls)
    for name in required_fields(cls):
        if name not in payload:
            raise EventDecodeError(f"missing_field:{name}", f"{cls.__name__} has no {name!r}")
    for name, value in payload.items():
        if name not in hints:
            raise EventDecodeError(f"unknown_field:{name}", f"{cls.__name__} has no field {name!r}")
        if not matches_type(value, hints[name]):
            raise EventDecodeError(f"type:{name}", f"{cls.__name__}.{name} = {value!r:.60} is not {hints[name]}")
    event_id = payload.pop("event_id", "")
    payload.pop("schema", None)
    event = cls(**payload)
    if event_id and event_id != event.event_id:
        raise EventDecodeError("event_id", f"event_id {event_id!r} does not match the event's identity")
    return event
