"""Benchmark: async runs with 1, 2 and 3 rollout workers (consumer group genenv-<run>-rollout), in the same process.

    .venv/bin/python tests/bench/streaming.py [--workers 1 2 3] [--epochs 3] [--profile quick] [--set k=v ...]

The default workload is the quick profile (tiny models) in seeds-only mode with 16 tasks an epoch, so every
epoch has 16 valid tasks to roll out (the tiny simulator's own tasks are mostly invalid).

Prints JSON, per worker count: tasks rolled out per minute of the workers' rollout phase (from the first to the
last rollout produced), its ratio against 1 worker, and the pool's freshness: seconds from a RolloutCompleted
being produced to its row being readable in gold/d_train (the Delta commit that added it), p50 and p99, with
the ingestor's micro-batch setting (`--max-batch-ms 500`, as `genenv run --async` starts it). Each run is
`genenv run --async` in a child process with the local broker, as a user runs it.

On a 2-core machine the rollout workers share the cores with the reward worker, the trainers and the
ingestor, so the scaling flattens at 2 workers: the ratio shows where.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def freshness(lake) -> list[float]:
    """Seconds from each rollout's produced_at to the commit time of the first d_train version holding it."""
    import polars as pl
    from deltalake import DeltaTable

    from lake import D_TRAIN, read_table, silver

    produced = dict(
        read_table(lake, silver("rollout"))
        .filter(pl.col("producer") != "warm-start")
        .select("rollout_id", "produced_at")
        .iter_rows()
    )
    committed = {entry["version"]: entry["timestamp"] / 1000 for entry in DeltaTable(lake.uri(D_TRAIN)).history()}
    seen: set[str] = set()
    delays = []
    for version in sorted(committed):
        ids = set(pl.scan_delta(lake.uri(D_TRAIN), version=version).select("rollout_id").collect()["rollout_id"])
        delays += [committed[version] - produced[i] for i in ids - seen if i in produced]
        seen |= ids
    return delays


def run(workers: int, epochs: int, profile: str, overrides: list[str]) -> dict:
    import polars as pl

    from lake import Lake, read_table, silver

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "lake"
        start = time.perf_counter()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "engine.cli",
                "run",
                "--profile",
                profile,
                "--async",
                "--lake",
                str(root),
                "--epochs",
                str(epochs),
                "--set",
                f"rollout_workers={workers}",
                *[a for o in overrides for a in ("--set", o)],
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        if result.returncode != 0:
            raise SystemExit(
                f"run with {workers} rollout workers failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
        lake = Lake(root, create=False)
        rollouts = read_table(lake, silver("rollout")).filter(pl.col("producer") != "warm-start")
        tasks = rollouts["task_id"].n_unique()
        span = rollouts["produced_at"].max() - rollouts["produced_at"].min()
        delays = sorted(freshness(lake))
        return {
            "rollout_workers": workers,
            "run_s": round(wall, 1),
            "tasks_rolled_out": tasks,
            "tasks_per_minute": round(60 * tasks / span, 2) if span else None,
            "by_worker": dict(rollouts.group_by("producer").agg(pl.col("task_id").n_unique()).iter_rows()),
            "freshness_p50_s": round(delays[len(delays) // 2], 2) if delays else None,
            "freshness_p99_s": round(delays[min(len(delays) - 1, int(0.99 * len(delays)))], 2) if delays else None,
            "ingest_max_batch_ms": 500,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--profile", default="quick")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=None,
        help="a run option (default: mode=seeds-only, tasks_per_epoch=16)",
    )
    args = parser.parse_args()
    overrides = args.overrides or ["mode=seeds-only", "tasks_per_epoch=16"]
    results = [run(n, args.epochs, args.profile, overrides) for n in args.workers]
    base = results[0]["tasks_per_minute"]
    for r in results:
        r["scaling_vs_first"] = round(r["tasks_per_minute"] / base, 2) if base and r["tasks_per_minute"] else None
    print(
        json.dumps(
            {
                "benchmark": "streaming",
                "profile": args.profile,
                "epochs": args.epochs,
                "set": overrides,
                "runs": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
