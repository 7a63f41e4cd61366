"""Reading what a producer wrote into an event's JSON text fields (difficulty, reference, metrics): a value or a
fallback, never an error, and never a structure deep enough to make a reader or a template recurse."""

from __future__ import annotations

import json
import math

MAX_SHOWN_BRACKETS = 200


def json_or_text(raw: str | None):
    """A JSON field a producer wrote (reference, difficulty): its value, or the text itself when it is not JSON
    or nests deeper than anything a domain writes (so no reader or template recurses on it)."""
    if raw is None:
        return None
    if raw.count("[") + raw.count("{") > MAX_SHOWN_BRACKETS:
        return raw
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw


def json_object(raw: str | None) -> dict:
    """A JSON object field (metrics): its value, or {} when it is not a JSON object."""
    value = json_or_text(raw)
    return value if isinstance(value, dict) else {}


def nan_to_none(value):
    """JSON has no NaN: a measure that could not be computed is null in an answer (in dicts and lists too)."""
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [nan_to_none(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def turns_in(raw: str | None) -> list[dict]:
    """A multi-turn rollout's turns from its turns_json (a producer's text: what does not parse, or nests deeper
    than Python's parser goes, is no turns)."""
    try:
        turns = json.loads(raw or "[]")
    except (ValueError, RecursionError):
        return []
    return [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []


def share_in_band(batches) -> float | None:
    """The share of scored tasks whose group is in the band (engine/coevolution/curriculum.py `in_band_share`), from
    a frame of BatchScored rows (filtered, n_tasks); None without rows."""
    tasks = batches["n_tasks"].sum() if batches.height else 0
    if not tasks:
        return None
    return float(batches.filter(~batches["filtered"])["n_tasks"].sum()) / float(tasks)
