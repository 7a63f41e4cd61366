"""Benchmark: the evaluation harness's scoring speed per benchmark, and end-to-end BFCL with a real model.

    .venv/bin/python tests/bench/eval.py [--data data] [--model smollm2-135m] [--items 16]

Prints JSON:
- scoring: items per second of scoring alone, per benchmark, with gold answers and no model (ALFWorld:
  playing each game's walkthrough through TextWorld, so it is the game engine's speed);
- end_to_end: items per second of `genenv eval`'s path (prompting, greedy generation, decoding, bfcl-eval's
  checker) with `--model` on BFCL simple_python, batched (--batch prompts at once) against one prompt at a
  time on the same items, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.benchmarks import BENCHMARKS, Ask, evaluate  # noqa: E402
from engine.benchmarks.bfcl import BFCL  # noqa: E402

LIMITS = {"alfworld": 12}  # games; every other benchmark is scored in full


class GoldAgent:
    def __init__(self, benchmark, items):
        self.benchmark, self.by_id = benchmark, {i.item_id: i for i in items}

    def respond(self, asks: list[Ask], progress=None) -> list[str]:
        out = []
        for a in asks:
            item = self.by_id[a.item_id]
            out.append(
                item.data["walkthrough"][a.turn] if self.benchmark.name == "alfworld" else self.benchmark.gold(item)
            )
        return out


def scoring(data: Path) -> dict:
    out = {}
    for name, cls in BENCHMARKS.items():
        benchmark = cls()
        items = benchmark.load(data, LIMITS.get(name))
        start = time.perf_counter()
        report = evaluate(name, GoldAgent(benchmark, items), benchmark=benchmark, items=items)
        seconds = time.perf_counter() - start
        out[name] = {
            "items": len(items),
            "seconds": round(seconds, 3),
            "items_per_s": round(len(items) / seconds, 1),
            benchmark.headline: report.metrics[benchmark.headline],
        }
    return out


def end_to_end(model: str, n: int, batch: int) -> dict:
    from engine.benchmarks import model_agent

    benchmark = BFCL(categories=("simple_python",))
    items = benchmark.load(None, n)
    out = {"model": model, "benchmark": "bfcl simple_python", "items": len(items)}
    for label, size in (("batched", batch), ("one_at_a_time", 1)):
        agent = model_agent(model, None, batch_size=size)
        evaluate("bfcl", agent, benchmark=benchmark, items=items[:1])  # warm up: first-call allocations
        start = time.perf_counter()
        report = evaluate("bfcl", agent, benchmark=benchmark, items=items)
        seconds = time.perf_counter() - start
        out[label] = {
            "batch_size": size,
            "seconds": round(seconds, 2),
            "items_per_s": round(len(items) / seconds, 3),
            "accuracy": report.metrics["accuracy_simple_python"],
        }
    out["ratio_batched_vs_one_at_a_time"] = round(
        out["batched"]["items_per_s"] / out["one_at_a_time"]["items_per_s"], 2
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "data")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    print(
        json.dumps(
            {"scoring": scoring(args.data), "end_to_end": end_to_end(args.model, args.items, args.batch)}, indent=2
        )
    )


if __name__ == "__main__":
    main()
