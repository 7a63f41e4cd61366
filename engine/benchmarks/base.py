"""What every benchmark shares: items, prompts, an agent that answers batches of prompts, per-item results.

    benchmark.load(data, limit) -> items          reads the benchmark's files (one-line DataMissing otherwise)
    benchmark.run(items, agent, progress)          asks the agent (batched), scores each answer -> ItemResult
    benchmark.summary(results) -> {metric: value}  the figures the benchmark's papers report

Single-turn benchmarks ask once per item and score the answer with `score`; multi-turn ones (ALFWorld)
override `run`. `gold(item)` is an answer the scorer must accept (the tests' gold agent answers with it,
and a perturbed copy of it must score 0): it is read from the benchmark's own reference data.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

Progress = Callable[[int, int], None]
DATA = Path(__file__).resolve().parents[2] / "data"  # the repository's benchmark data (data/README.md)


class DataMissing(FileNotFoundError):
    """A benchmark's data is not where it was looked for: one line naming the file and where to get it."""


@dataclass(frozen=True)
class Ask:
    """One prompt for the agent."""

    system: str
    user: str
    max_new_tokens: int = 128
    item_id: str = ""  # which item (and, multi-turn, which turn) it is about: scripted agents answer by it
    turn: int = 0


@dataclass
class Item:
    item_id: str
    category: str  # what the per-category figures group by (BFCL category, ALFWorld task type, ...)
    data: dict[str, Any]


@dataclass
class ItemResult:
    item_id: str
    category: str
    response: str
    score: float  # 1.0 right, 0.0 wrong; partial credit where the benchmark defines it (token F1)
    metrics: dict[str, float] = field(default_factory=dict)  # the item's other measures (em, f1, steps, ...)
    detail: str = ""  # why, for audits


class Agent(Protocol):
    def respond(self, asks: Sequence[Ask], progress: Progress | None = None) -> list[str]: ...


class Benchmark:
    name = ""
    source = ""  # where the data comes from, for the one-line error when it is missing
    headline = ""  # the metric a one-line summary shows
    scoring = ""  # how answers are scored where it differs from the official evaluator (shown with the results)

    def load(self, data: Path | None, limit: int | None) -> list[Item]:
        raise NotImplementedError

    def ask(self, item: Item) -> Ask:
        raise NotImplementedError

    def gold(self, item: Item) -> str:
        raise NotImplementedError

    def score(self, item: Item, response: str) -> ItemResult:
        raise NotImplementedError

    def summary(self, results: list[ItemResult]) -> dict[str, float]:
        return {"accuracy": mean([r.score for r in results])}

    def run(self, items: list[Item], agent: Agent, progress: Progress | None = None) -> list[ItemResult]:
        asks = [replace(self.ask(item), item_id=item.item_id) for item in items]
        responses = agent.respond(asks, progress)
        return [self.score(item, response) for item, response in zip(items, responses)]

    # -- helpers -------------------------------------------------------------------------------------
    def read_json(self, path: Path, lines: bool = False):
        """A data file's JSON (with lines=True: JSON lines, as a list), or DataMissing saying what is wrong."""
        if not path.is_file():
            raise DataMissing(f"{self.name}: {path} does not exist ({self.source})")
        try:
            text = path.read_text()
            return [json.loads(line) for line in text.splitlines() if line.strip()] if lines else json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataMissing(f"{self.name}: {path} is not {'JSON lines' if lines else 'JSON'} ({exc})") from None

    def records(self, path: Path, lines: bool = False) -> list[dict]:
        """A data file's records (a JSON list of objects, or JSON lines of one object each), or DataMissing naming
        the file and the first record that is not an object."""
        rows = self.read_json(path, lines)
        if not isinstance(rows, list):
            raise DataMissing(f"{self.name}: {path} holds a JSON {type(rows).__name__}, not a list of records")
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DataMissing(f"{self.name}: {path} record {index} is a JSON {type(row).__name__}, not an object")
        return rows

    def text(self, path: Path, index: int, row: dict, name: str) -> str:
        """Field `name` of a record as non-empty text (an integer or a finite number is taken as its text), or
        DataMissing naming the file, the record and the field: a null or NaN answer must not score anything."""
        value = row.get(name)
        if isinstance(value, float) and math.isfinite(value) or isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str) or not value.strip():
            raise DataMissing(f"{self.name}: {path} record {index}: {name} must be non-empty text, got {value!r:.40}")
        return value

    def field(self, path: Path, index: int, row: dict, name: str, kind: type):
        """Field `name` of a record, of JSON type `kind` (list, dict), or DataMissing naming the record and field."""
        value = row.get(name)
        if not isinstance(value, kind):
            raise DataMissing(f"{self.name}: {path} record {index}: {name} must be a JSON {kind.__name__}")
        return value

    def file(self, data: Path | None, relative: str) -> Path:
        """A data file under `data` (default: the repository's data/ folder), or DataMissing naming it and where
        to get it."""
        path = Path(DATA if data is None else data) / relative
        if not path.exists():
            raise DataMissing(f"{self.name}: {path} does not exist ({self.source})")
        return path


def mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 4) if values else float("nan")


def per_category(
    results: list[ItemResult], metric: Callable[[ItemResult], float] = lambda r: r.score
) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for r in results:
        groups.setdefault(r.category, []).append(metric(r))
    return {category: mean(values) for category, values in sorted(groups.items())}


def limited(items: list[Item], limit: int | None) -> list[Item]:
    return items if limit is None else items[:limit]
