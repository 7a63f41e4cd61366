"""The evaluation harness: any model or registered checkpoint on any benchmark, results into the lake.

    agent = model_agent("agent:v3", lake)     # or "smollm2-135m", a folder, a GGUF file, a hub id
    report = evaluate("bfcl", agent, data=Path("data"), limit=50)
    record(lake, report)                      # eval/results (one row per metric), eval/items (one per item)

A model answers greedily, in batches (`TransformersBackend`), with its chat template. Checkpoints are named
`agent:vN` / `env:vN` (or `agent:latest`) and loaded from the lake's registry after their sha256 is checked.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from lake import EVAL_ITEMS, EVAL_RESULTS, SCHEMAS, Lake
from trainers import (
    SamplingConfig,
    TransformersBackend,
    latest_version,
    load_checkpoint,
    load_model,
    registered,
    render_prompt,
)

from .alfworld import ALFWorld
from .apibank import APIBank
from .bamboogle import Bamboogle
from .base import Ask, Benchmark, ItemResult, Progress
from .bfcl import BFCL
from .travelplanner import TravelPlanner

BENCHMARKS: dict[str, type[Benchmark]] = {
    "bfcl": BFCL,
    "api-bank": APIBank,
    "bamboogle": Bamboogle,
    "alfworld": ALFWorld,
    "travelplanner": TravelPlanner,
}
# What the GenEnv paper reports for its 7B agent (Table 1), for comparison with the headline metric.
PAPER = {"bfcl": 41.8, "api-bank": 79.1, "bamboogle": 76.0, "alfworld": 54.5, "travelplanner": 16.6}
CHECKPOINT = re.compile(r"(agent|env):(?:v?(\d+)|latest)")


class EvalError(ValueError):
    """An unknown benchmark, a model that cannot be loaded: one line for the user."""


def benchmark_names(name: str) -> list[str]:
    if name == "all":
        return list(BENCHMARKS)
    if name not in BENCHMARKS:
        raise EvalError(f"unknown benchmark {name!r}; benchmarks: {', '.join(BENCHMARKS)}, all")
    return [name]


class ModelAgent:
    """A model answering greedily, a batch at a time."""

    def __init__(self, loaded, version: str, batch_size: int = 16):
        self.backend = TransformersBackend(loaded.model, loaded.tokenizer, batch_size=batch_size)
        self.tokenizer = loaded.tokenizer
        self.version = version

    def respond(self, asks: Sequence[Ask], progress: Progress | None = None) -> list[str]:
        if not asks:
            return []
        prompts = [render_prompt(self.tokenizer, a.user, system=a.system) for a in asks]
        sampling = SamplingConfig(max_new_tokens=max(a.max_new_tokens for a in asks), temperature=0.0)
        return [g.text for g in self.backend.generate(prompts, sampling, progress=progress)]


def model_agent(model: str, lake: Lake | None, batch_size: int = 16) -> ModelAgent:
    """A model by name, path or hub id, or a registered checkpoint `agent:vN` / `env:vN` / `agent:latest`."""
    match = CHECKPOINT.fullmatch(model)
    if match is None:
        return ModelAgent(load_model(model), model, batch_size)
    if lake is None:
        raise EvalError(f"{model} names a checkpoint: give the lake that registers it (--lake)")
    kind = match.group(1)
    version = int(match.group(2)) if match.group(2) else latest_version(lake, kind)
    if version == 0:
        raise EvalError(f"no {kind} checkpoint is registered in {lake.root}")
    row = registered(lake, kind, version)
    return ModelAgent(load_checkpoint(lake, kind, version), f"{kind}:v{version} ({row['sha256'][:12]})", batch_size)


@dataclass
class EvalReport:
    benchmark: str
    model: str
    model_version: str
    metrics: dict[str, float]
    results: list[ItemResult]
    scoring: str
    config: dict = field(default_factory=dict)
    seconds: float = 0.0
    eval_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


def evaluate(
    name: str,
    agent,
    model: str = "",
    data: Path | None = None,
    limit: int | None = None,
    progress: Progress | None = None,
    benchmark: Benchmark | None = None,
    items: list | None = None,
) -> EvalReport:
    """Load one benchmark's items (unless given, already loaded by `benchmark`), let the agent answer, score them."""
    benchmark = benchmark or BENCHMARKS[benchmark_names(name)[0]]()
    start = time.perf_counter()
    items = benchmark.load(data, limit) if items is None else items
    results = benchmark.run(items, agent, progress)
    return EvalReport(
        name,
        model,
        getattr(agent, "version", model),
        benchmark.summary(results),
        results,
        benchmark.scoring or "the benchmark's official metric",
        {"limit": limit, "data": str(data) if data else None, "items": len(items), "decoding": "greedy"},
        round(time.perf_counter() - start, 2),
    )


def record(lake: Lake, report: EvalReport) -> None:
    """One row per metric in eval/results, one per item in eval/items."""
    lake.ensure()  # lakes made before the eval tables existed get them now
    now = datetime.now(UTC)
    metrics = {k: v for k, v in report.metrics.items() if isinstance(v, (int, float))}
    lake.append(
        EVAL_RESULTS,
        pa.Table.from_pylist(
            [
                {
                    "eval_id": report.eval_id,
                    "model": report.model,
                    "model_version": report.model_version,
                    "benchmark": report.benchmark,
                    "metric": metric,
                    "value": float(value),
                    "items": len(report.results),
                    "scoring": report.scoring,
                    "config_json": json.dumps({**report.config, "seconds": report.seconds}, sort_keys=True),
                    "evaluated_at": now,
                }
                for metric, value in metrics.items()
            ],
            SCHEMAS[EVAL_RESULTS],
        ),
    )
    lake.append(
        EVAL_ITEMS,
        pa.Table.from_pylist(
            [
                {
                    "eval_id": report.eval_id,
                    "benchmark": report.benchmark,
                    "item_id": r.item_id,
                    "category": r.category,
                    "score": r.score,
                    "response": r.response,
                    "detail": r.detail,
                    "metrics_json": json.dumps(r.metrics, sort_keys=True),
                }
                for r in report.results
            ],
            SCHEMAS[EVAL_ITEMS],
        ),
    )


def report_dict(report: EvalReport) -> dict:
    out = asdict(report)
    out["results"] = len(report.results)
    return out
