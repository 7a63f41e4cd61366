"""Benchmark: audit latency in a lake of >= 100,000 tasks, and replay time of an epoch against its original wall time.

    .venv/bin/python tests/bench/audit.py [--tasks 100000] [--group 2] [--lake PATH]

Prints JSON:
- lake: how it was built (synthetic epochs written to bronze and refined by the ingestor's own refine step,
  GX suites included, as `genenv ingest` would after reading them from Kafka; Kafka itself is left out) and
  the row counts it holds;
- audit_task: seconds of `audit_task` for random task ids (median, p95, max; target <= 1 s) against a
  baseline in the same process that answers the same question by reading the tables whole and filtering
  in memory (what pushdown saves);
- replay: quick runs (tiny models, the real local broker; modes genenv and seeds-only, 3 epochs) in a fresh
  lake and in the big lake: each epoch's original wall time (generation, rollouts, ingest, training,
  validation) against `replay_epoch` of that epoch.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # demo_events

import polars as pl  # noqa: E402
import pyarrow as pa  # noqa: E402

from lake import Lake, read_table, silver  # noqa: E402
from lake.ingest import Ingestor  # noqa: E402
from lake.tables import BRONZE_SCHEMA, bronze  # noqa: E402


def build_lake(root: Path, n_tasks: int, group: int, chunk_tasks: int = 10_000) -> dict:
    """n_tasks synthetic tasks (G rollouts and rewards each, a batch per 64 tasks) into bronze, refined in chunks."""
    from demo_events import epoch_events

    lake = Lake(root)
    offsets: dict[str, int] = {}
    start = time.perf_counter()
    epoch = 0
    while epoch * chunk_tasks < n_tasks:
        events = epoch_events(
            run_id="bench",
            epoch=epoch,
            tasks=min(chunk_tasks, n_tasks - epoch * chunk_tasks),
            group=group,
            seed=epoch,
            batch_size=64,
        )
        by_topic: dict[str, list] = {}
        for event in events:
            by_topic.setdefault(event.TOPIC, []).append(event)
        for topic, topic_events in by_topic.items():
            first = offsets.get(topic, 0)
            offsets[topic] = first + len(topic_events)
            rows = pa.table(
                {
                    "topic": [topic] * len(topic_events),
                    "kafka_cluster": ["bench-cluster"] * len(topic_events),
                    "kafka_partition": pa.array([0] * len(topic_events), pa.int32()),
                    "kafka_offset": pa.array(range(first, first + len(topic_events)), pa.int64()),
                    "kafka_timestamp": pa.array([int(time.time() * 1000)] * len(topic_events), pa.int64()),
                    "key": [e.key.encode() for e in topic_events],
                    "value": [e.to_json() for e in topic_events],
                    "ingested_at": pa.array([time.time_ns() // 1000] * len(topic_events), pa.timestamp("us", tz="UTC")),
                },
                schema=BRONZE_SCHEMA,
            )
            lake.append(bronze(topic), rows)
        Ingestor(lake, bootstrap="").recover()  # one refine step over what bronze holds past the watermark
        epoch += 1
        print(
            f"  built {min(epoch * chunk_tasks, n_tasks)} tasks ({time.perf_counter() - start:.0f}s)", file=sys.stderr
        )
    counts = {
        name: read_table(lake, name).height
        for name in (silver("task"), silver("rollout"), silver("reward"), "gold/d_train")
    }
    return {
        "tasks": n_tasks,
        "group_size": group,
        "refine_steps": epoch,
        "rows": counts,
        "build_seconds": round(time.perf_counter() - start, 1),
    }


def full_scan_baseline(lake: Lake, task_id: str) -> dict:
    """The same rows as audit_task's core, read by loading whole tables and filtering in memory."""
    out = {}
    for kind in ("task", "rollout", "reward"):
        out[kind] = read_table(lake, silver(kind)).filter(pl.col("task_id") == task_id).height
    out["batch"] = read_table(lake, silver("batch")).filter(pl.col("task_ids").list.contains(task_id)).height
    return out


def time_calls(fn, ids: list[str]) -> dict:
    seconds = []
    for task_id in ids:
        start = time.perf_counter()
        fn(task_id)
        seconds.append(time.perf_counter() - start)
    seconds.sort()
    return {
        "calls": len(ids),
        "median_s": round(statistics.median(seconds), 4),
        "p95_s": round(seconds[int(0.95 * (len(seconds) - 1))], 4),
        "max_s": round(seconds[-1], 4),
    }


def bench_replay(root: Path, mode: str) -> dict:
    """A quick run (tiny models) into the lake at `root`; each epoch's wall time against its replay's."""
    from engine.coevolution import CoEvolution, LakeWriter, load_config
    from engine.lineage import replay_epoch
    from streams import LocalBroker

    lake = Lake(root)
    config = load_config("quick", None, ["seed=1", f"mode={mode}", "epochs=3"])
    with LocalBroker() as broker, LakeWriter(lake, broker.bootstrap) as writer:
        engine = CoEvolution(config, lake, writer, say=lambda _: None)
        engine.prepare()
        start = time.perf_counter()
        engine.warm_start()
        warm = time.perf_counter() - start
        engine.initial_validation = engine.validate()
        originals = []
        for epoch in range(config.epochs):
            start = time.perf_counter()
            engine.epoch(epoch)
            originals.append(time.perf_counter() - start + (warm if epoch == 0 else 0.0))
    out = []
    for epoch, original in enumerate(originals):
        result = replay_epoch(lake, epoch, engine.run_id, say=lambda _: None)
        out.append(
            {
                "epoch": epoch,
                "original_s": round(original, 2),
                "replay_s": result.seconds,
                "ratio": round(result.seconds / original, 3),
                "checkpoints": len(result.checkpoints),
                "identical": result.ok,
            }
        )
    return {"run": engine.run_id, "mode": mode, "epochs": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--group", type=int, default=2, help="rollouts per task")
    parser.add_argument("--lake", type=Path, help="reuse (or build) the big lake here")
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()

    from engine.lineage import audit_task

    root = args.lake or Path(tempfile.mkdtemp(prefix="genenv-bench-audit-"))
    built = Lake(root, create=False) if (root / "silver").is_dir() else None
    info = {"reused": str(root)} if built else build_lake(root, args.tasks, args.group)
    lake = Lake(root, create=False)
    ids = read_table(lake, silver("task"))["task_id"].to_list()
    rng = random.Random(0)
    sample = rng.sample(ids, min(args.calls, len(ids)))
    audit_task(lake, sample[0])  # warm: imports, the first Delta log read
    result = {
        "lake": {**info, "tasks_in_lake": len(ids)},
        "audit_task": time_calls(lambda t: audit_task(lake, t), sample),
        "full_scan_baseline": time_calls(lambda t: full_scan_baseline(lake, t), sample[: max(3, args.calls // 5)]),
    }
    result["audit_vs_full_scan"] = round(result["audit_task"]["median_s"] / result["full_scan_baseline"]["median_s"], 3)
    # Quick runs (tiny models; epoch 0 includes the warm start) in a fresh lake and in the big one.
    with tempfile.TemporaryDirectory(prefix="genenv-bench-replay-") as scratch:
        result["replay_fresh_lake"] = [bench_replay(Path(scratch) / "lake", mode) for mode in ("genenv", "seeds-only")]
    result["replay_in_the_big_lake"] = [bench_replay(root, mode) for mode in ("genenv", "seeds-only")]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
