"""Offline benchmarks for any agent checkpoint: BFCL, API-Bank, Bamboogle, ALFWorld and TravelPlanner.

from engine.benchmarks import evaluate, model_agent, record
report = evaluate("bamboogle", model_agent("agent:v3", lake), data=Path("data"))
"""

from .base import Agent, Ask, Benchmark, DataMissing, Item, ItemResult
from .harness import (
    BENCHMARKS,
    PAPER,
    EvalError,
    EvalReport,
    ModelAgent,
    benchmark_names,
    evaluate,
    model_agent,
    record,
)

__all__ = [
    "BENCHMARKS",
    "PAPER",
    "Agent",
    "Ask",
    "Benchmark",
    "DataMissing",
    "EvalError",
    "EvalReport",
    "Item",
    "ItemResult",
    "ModelAgent",
    "benchmark_names",
    "evaluate",
    "model_agent",
    "record",
]
