"""The seven kinds of event that flow through Kafka, and their JSON encoding.

Invariants:
- One event is one flat JSON object (scalars and lists of scalars; structured
  payloads such as tool schemas travel as JSON strings), so every kind maps onto
  one typed Delta table without guessing.
- `schema` is "genenv.<kind>/<version>"; a decoder refuses any kind or version
  it does not know, naming it.
- `event_id` is a hash of the event's identity (kind, run, epoch and its own
  ids), never of its timestamp or free text, so replaying a run yields the same
  ids and duplicates are recognisable.
- `decode` is the contract (docs/EVENTS.md), enforced here and nowhere else:
  UTF-8 JSON objects of at most MAX_EVENT_BYTES, no unknown fields, exact
  types (a bool is not a number), finite floats, 64-bit ints, non-empty ids,
  and an `event_id` equal to the hash of the identity. Size, encoding and
  nesting are checked before the JSON parser runs, so no payload can make
  anything downstream recurse, overflow or fail to encode.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

SCHEMA_VERSION = 1


class EventDecodeError(ValueError):
    """A payload that is not a well-formed genenv event. `check` names what failed; `payload` is the parsed
    JSON object when parsing got that far (so a quarantine row can still name the event's ids)."""

    def __init__(self, check: str, message: str, payload: dict | None = None):
        super().__init__(f"{check}: {message}")
        self.check = check
        self.payload = payload


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
    offered_json: str = "[]"  # the difficulty levels the simulator's request offered to choose from (toolcall)
    temperature: float | None = None  # what the generation was sampled at (None: not generated, a seed task)
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
    temperature: float | None = None  # what the completion was sampled at: its logprobs are of softmax(logits / T)


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


@dataclass(frozen=True, kw_only=True)
class WorkerRestarted(Event):
    """A supervisor restarted a worker that died: the record `genenv audit epoch` shows (epoch: the newest round
    the run's simulator had written)."""

    KIND: ClassVar[str] = "restart"
    TOPIC: ClassVar[str] = "genenv.workers"
    IDENTITY: ClassVar[tuple[str, ...]] = ("worker", "restart")

    worker: str
    role: str
    exit_code: int
    restart: int  # 1 for the worker's first restart

    @property
    def key(self) -> str:
        return self.worker


@dataclass(frozen=True, kw_only=True)
class TaskReassigned(Event):
    """A reward worker held a task whose group was still incomplete past `reassign_after_s` and sent the task
    again, so that a rollout worker makes the rollouts the lake lacks: the record `genenv audit task` shows."""

    KIND: ClassVar[str] = "reassign"
    TOPIC: ClassVar[str] = "genenv.reassignments"
    IDENTITY: ClassVar[tuple[str, ...]] = ("task_id", "reassignment")

    task_id: str
    rollouts_missing: int  # of the group's group_size, when the task was sent again
    held_s: float  # how long the worker had held the task
    reassignment: int  # 1 for the task's first (counted by the worker that holds it)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.KIND: cls
    for cls in (
        TaskGenerated,
        RolloutCompleted,
        RewardScored,
        BatchScored,
        CheckpointPublished,
        WorkerRestarted,
        TaskReassigned,
    )
}
TOPICS: dict[str, str] = {kind: cls.TOPIC for kind, cls in EVENT_TYPES.items()}
KIND_OF_TOPIC: dict[str, str] = {topic: kind for kind, topic in TOPICS.items()}


def event_of(kind: str, fields: dict[str, Any]) -> Event:
    """The event of a kind from its fields (a silver row: the same event, the same event_id)."""
    cls = EVENT_TYPES[kind]
    return cls(**{name: fields[name] for name in field_types(cls) if name != "schema"})


# -- the contract (docs/EVENTS.md) ---------------------------------------------------------------------
# Every rule is checked here, once, before any other code sees the payload; the lake's expectation suites
# check only content (ranges, value sets, lengths, references), on values whose types this guarantees.

MAX_EVENT_BYTES = 1 << 20  # Kafka's default message.max.bytes: a default cluster refuses larger values anyway
MAX_OPEN_BRACKETS = 8  # outside strings; an event is one object whose lists hold scalars (3 brackets at most)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
ID_FIELDS = frozenset({"event_id", "run_id", "task_id", "batch_id", "rollout_id", "model_kind", "worker"})
_STRING_LITERALS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@functools.cache
def field_types(cls: type[Event]) -> dict[str, Any]:
    """Field name -> resolved type annotation, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


@functools.cache
def required_fields(cls: type[Event]) -> tuple[str, ...]:
    """Fields a payload must carry: those without a default, and the envelope (schema, event_id)."""
    own = tuple(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    return own + ("schema", "event_id")


@dataclass(frozen=True)
class FieldRule:
    """What a field's JSON value may be, resolved once per field from its annotation."""

    annotation: Any
    types: frozenset  # exact Python types of the value (of its items, for a list); a bool is neither int nor float
    is_list: bool
    is_float: bool  # ints become floats, and every value must be finite
    is_int: bool  # within the signed 64-bit range


@functools.cache
def field_rules(cls: type[Event]) -> dict[str, FieldRule]:
    """Field name -> its rule; annotations are a scalar, an optional scalar or a list of scalars."""
    rules = {}
    for name, annotation in field_types(cls).items():
        arms = (
            set(typing.get_args(annotation))
            if typing.get_origin(annotation) in (types.UnionType, typing.Union)
            else {annotation}
        )
        is_list = any(typing.get_origin(a) is list for a in arms)
        if is_list:
            (arms,) = [set(typing.get_args(a)) for a in arms if typing.get_origin(a) is list]
        allowed = ({int} | set(arms)) if float in arms else set(arms)  # an optional float keeps its None
        rules[name] = FieldRule(annotation, frozenset(allowed), is_list, float in arms, int in arms)
    return rules


def _refuse_constant(name: str):
    raise EventDecodeError("not_finite", f"{name} is not a number JSON allows")


def _json_object(raw: bytes | str | None) -> dict[str, Any]:
    """The payload as a dict, or EventDecodeError: size, encoding and nesting are checked before parsing."""
    if not raw:
        raise EventDecodeError("empty", "empty message value")
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    if len(data) > MAX_EVENT_BYTES:
        raise EventDecodeError("too_large", f"{len(data):,} bytes; an event is at most {MAX_EVENT_BYTES:,}")
    if data.startswith(b"\xef\xbb\xbf"):
        raise EventDecodeError("not_utf8", "starts with a byte order mark; events are UTF-8 without one")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EventDecodeError("not_utf8", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    # Counted with string literals removed, in C (a regex and bytes.count): deep nesting never reaches a parser.
    skeleton = _STRING_LITERALS.sub(b"", data)
    if skeleton.count(b"{") + skeleton.count(b"[") > MAX_OPEN_BRACKETS:
        raise EventDecodeError("too_nested", f"more than {MAX_OPEN_BRACKETS} objects or lists; events are flat")
    try:
        payload = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:  # unreachable after the count above, kept as the parser's own bound
        raise EventDecodeError("too_nested", "nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and integers of more than 4,300 digits
        if isinstance(exc, EventDecodeError):
            raise
        raise EventDecodeError("not_json", f"value is not JSON ({exc.__class__.__name__}: {str(exc)[:120]})") from None
    if type(payload) is not dict:
        raise EventDecodeError("not_object", f"value is a JSON {type(payload).__name__}, not an object")
    if _SURROGATE_ESCAPE.search(text):  # escaped surrogates: pairs are fine, a lone one is not text
        for name, value in payload.items():
            for item in value if type(value) is list else (name, value):
                if type(item) is str:
                    try:
                        item.encode("utf-8")
                    except UnicodeEncodeError:
                        raise EventDecodeError("not_utf8", f"{_shown(name)} holds a lone surrogate") from None
    return payload


def payload_of(raw: bytes | str | None) -> dict[str, Any] | None:
    """The JSON object a record holds, under the contract's size, encoding and nesting limits; None otherwise
    (for readers of the quarantine, which holds records that may break any rule)."""
    try:
        return _json_object(raw)
    except EventDecodeError:
        return None


def _shown(name: Any) -> str:
    """A producer-chosen name, safe to put in a message: repr, cut short."""
    return repr(name)[:40]


def event_class(payload: dict[str, Any]) -> type[Event]:
    """The event class a payload's `schema` names."""
    schema = payload.get("schema")
    if type(schema) is not str or not schema.startswith("genenv.") or "/" not in schema:
        raise EventDecodeError("unknown_schema", f"missing or malformed schema field {_shown(schema)}")
    kind, _, version = schema[len("genenv.") :].partition("/")
    if kind not in EVENT_TYPES:
        raise EventDecodeError("unknown_schema", f"unknown event kind {_shown(kind)} in schema {_shown(schema)}")
    if version != str(SCHEMA_VERSION):
        raise EventDecodeError(
            "unknown_schema",
            f"unsupported schema version {_shown(version)} in {_shown(schema)} (this build reads /{SCHEMA_VERSION})",
        )
    return EVENT_TYPES[kind]


def _check_value(cls: type[Event], name: str, value: Any, rule: FieldRule) -> Any:
    """The value as the event holds it (ints in float fields become floats), or EventDecodeError."""
    items = value if rule.is_list and type(value) is list else (value,)
    if (rule.is_list and type(value) is not list) or any(type(item) not in rule.types for item in items):
        raise EventDecodeError(f"type:{name}", f"{cls.__name__}.{name} = {repr(value)[:60]} is not {rule.annotation}")
    if rule.is_float and value is not None:
        try:
            converted = [float(v) for v in items]
        except OverflowError:
            raise EventDecodeError(f"not_finite:{name}", f"{cls.__name__}.{name} is too large for a float") from None
        if not all(map(math.isfinite, converted)):
            raise EventDecodeError(f"not_finite:{name}", f"{cls.__name__}.{name} is not finite")
        return converted if rule.is_list else converted[0]
    if rule.is_int and any(type(i) is int and not INT64_MIN <= i <= INT64_MAX for i in items):
        raise EventDecodeError(f"int_range:{name}", f"{cls.__name__}.{name} is outside the 64-bit integer range")
    if name in ID_FIELDS and value == "":
        raise EventDecodeError(f"empty_id:{name}", f"{cls.__name__}.{name} is empty")
    return value


def decode(raw: bytes | str | None) -> Event:
    """A typed event from a Kafka value, or EventDecodeError naming the first rule it breaks (docs/EVENTS.md)."""
    payload = _json_object(raw)
    try:
        return _typed_event(payload)
    except EventDecodeError as exc:
        exc.payload = payload
        raise


def _typed_event(payload: dict[str, Any]) -> Event:
    cls = event_class(payload)
    rules = field_rules(cls)
    for name in payload:
        if name not in rules:
            raise EventDecodeError("unknown_field", f"{cls.__name__} has no field {_shown(name)}")
    for name in required_fields(cls):
        if name not in payload:
            raise EventDecodeError(f"missing_field:{name}", f"{cls.__name__} has no {name!r}")
    values = {name: _check_value(cls, name, value, rules[name]) for name, value in payload.items()}
    values.pop("schema")
    event = cls(**values)
    if event.identity_hash() != event.event_id:
        raise EventDecodeError("event_id", f"event_id {_shown(event.event_id)} is not the hash of the event's identity")
    return event


def content_digest(fields: dict[str, Any]) -> str:
    """What tells a redelivery from a conflicting duplicate: every field but the time it was produced."""
    content = {k: v for k, v in fields.items() if k != "produced_at"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
