"""Running the async mode: the warm start, then one process per role, then a report read from the lake.

`genenv run --async` is a convenience for one machine: it starts the workers that a deployment would
run as separate services (`genenv worker ROLE` and `genenv ingest`, see docker-compose.yml), waits
until the agent trainer has made `epochs` updates and the simulator has written `epochs` rounds,
stops the other workers, lets the ingestor catch up with the log, and stops it.
"""

from __future__ import annotations

import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from lake import CHECKPOINTS, VALIDATIONS, Lake, lag, read_table, silver
from streams.broker import terminate

from .audit import json_object
from .config import RunConfig, to_toml
from .loop import Engine, EpochMetrics
from .publishing import LakeWriter
from .workers import ROLES

ROOT = Path(__file__).resolve().parents[1]


def run_async(config: RunConfig, lake: Lake, bootstrap: str, say=print, timeout_s: float = 3600, phase=None) -> Engine:
    with LakeWriter(lake, bootstrap) as writer:
        engine = Engine(config, lake, writer, say, phase=phase)
        if config.warm_start:
            engine.warm_start()
        engine.initial_accuracy = engine.validate()
        say(f"validation accuracy before training: {engine.initial_accuracy:.3f}")
    engine.agent = engine.simulator = None  # the workers hold the models from here on
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(to_toml(config))
    common = ["--lake", lake.root, "--bootstrap", bootstrap]
    commands = {role: ["worker", role, *common, "--run-id", engine.run_id, "--config", f.name] for role in ROLES}
    commands["ingest"] = ["ingest", *common, "--max-batch-ms", "500"]
    procs = {role: subprocess.Popen([sys.executable, "-m", "engine.cli", *args], cwd=ROOT) for role, args in commands.items()}
    deadline = time.monotonic() + timeout_s

    def wait(until, what: str) -> None:
        while not until():
            failed = [r for r, p in procs.items() if p.poll() not in (None, 0)]
            if failed:
                raise RuntimeError(f"async run: worker {failed[0]} exited with code {procs[failed[0]].returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"async run: {what} within {timeout_s:.0f}s")
            time.sleep(1.0)

    try:
        # The simulator has written every round; then every valid task gets scored, and the agent trainer
        # either makes its last update or has trained on everything the pool holds.
        wait(lambda: procs["simulator"].poll() is not None, "the simulator did not write its rounds")
        wait(lambda: lag(lake, bootstrap) == 0 and not _unscored_tasks(lake, engine.run_id), "rewards did not land")
        wait(lambda: procs["train-agent"].poll() is not None or _agent_caught_up(lake, engine.run_id),
             "the agent trainer did not catch up")
        for role in ("rollout", "reward", "train-agent", "train-env"):
            terminate(procs[role])
        wait(lambda: lag(lake, bootstrap) == 0 and not _still_refining(lake), "the ingestor did not catch up")
    finally:
        for proc in procs.values():
            terminate(proc)
        Path(f.name).unlink(missing_ok=True)
    return engine


def _unscored_tasks(lake: Lake, run_id: str) -> int:
    """Valid tasks of the run that no BatchScored covers yet."""
    tasks = read_table(lake, silver("task")).filter((pl.col("run_id") == run_id) & pl.col("valid"))
    covered = read_table(lake, silver("batch")).filter(pl.col("run_id") == run_id)["task_ids"].explode()
    return tasks.filter(~pl.col("task_id").is_in(covered.implode())).height


def _agent_caught_up(lake: Lake, run_id: str) -> bool:
    """The run's newest agent checkpoint was trained on the pool version that holds all the run's rollouts."""
    checkpoints = read_table(lake, CHECKPOINTS).filter((pl.col("run_id") == run_id) & (pl.col("model_kind") == "agent"))
    if checkpoints.is_empty():
        return False
    trained_on = int(checkpoints["pool_version"].max())
    rows_then = read_table(lake, "gold/d_train", trained_on).filter(pl.col("run_id") == run_id).height
    return rows_then == read_table(lake, "gold/d_train").filter(pl.col("run_id") == run_id).height


def _still_refining(lake: Lake, quiet_s: float = 2.0) -> bool:
    """True while the ingestor is still committing refine steps (its commit record table keeps moving)."""
    before = lake.version(VALIDATIONS)
    time.sleep(quiet_s)
    return lake.version(VALIDATIONS) != before


FEATURE_NAME = re.compile(r"[A-Za-z0-9_ .-]{1,40}")
MAX_FEATURES = 12


def difficulty_means(difficulty_jsons: list[str | None]) -> dict[str, float]:
    """Mean of each numeric difficulty feature over the tasks that have it. A producer writes difficulty_json, so
    it may be anything: what is not a JSON object of finite numbers under plain names (they become plot labels)
    is left out, never an error; at most MAX_FEATURES features, by name."""
    values: dict[str, list[float]] = {}
    for raw in difficulty_jsons:
        for name, value in json_object(raw).items():
            if type(value) not in (int, float) or not FEATURE_NAME.fullmatch(name):
                continue
            try:
                number = float(value)
            except OverflowError:
                continue
            if math.isfinite(number):
                values.setdefault(name, []).append(number)
    return {name: round(statistics.fmean(values[name]), 3) for name in sorted(values)[:MAX_FEATURES]}


def metrics_from_lake(lake: Lake, run_id: str) -> list[EpochMetrics]:
    """Per-epoch metrics of a run, computed from what the lake holds (the async mode's report)."""
    def of_run(table: str) -> pl.DataFrame:
        frame = read_table(lake, table)
        return frame.filter(pl.col("run_id") == run_id)

    not_warm_start = pl.col("producer") != "warm-start"
    tasks = of_run(silver("task")).filter(not_warm_start)
    rollouts = of_run(silver("rollout")).filter(not_warm_start)
    rewards = of_run(silver("reward")).filter(not_warm_start)
    batches = of_run(silver("batch")).filter(not_warm_start)
    checkpoints = of_run(CHECKPOINTS).sort("version")
    out = []
    for epoch in sorted(set(tasks["epoch"].to_list())):
        t = tasks.filter(pl.col("epoch") == epoch)
        valid = t.filter(pl.col("valid"))
        r = rewards.filter(pl.col("epoch") == epoch)
        b = batches.filter(pl.col("epoch") == epoch)
        ro = rollouts.filter(pl.col("epoch") == epoch)
        upto = checkpoints.filter(pl.col("epoch") <= epoch)
        agents = upto.filter(pl.col("model_kind") == "agent")
        envs = upto.filter(pl.col("model_kind") == "env")
        validation = [json_object(m).get("validation_accuracy") for m in
                      checkpoints.filter((pl.col("epoch") == epoch) & (pl.col("model_kind") == "agent"))["metrics_json"]]
        validation = [v for v in validation if type(v) in (int, float)]
        out.append(EpochMetrics(
            epoch=epoch, agent_version=int(agents["version"].max() or 0) if agents.height else 0,
            env_version=int(envs["version"].max() or 0) if envs.height else 0, tasks=t.height,
            valid_share=round(valid.height / max(t.height, 1), 3),
            agent_success=round(r["success"].mean() or 0.0, 3) if r.height else 0.0,
            batch_p_hats=[round(p, 3) for p in b["p_hat"].to_list()],
            in_band_share=round(1 - (b["filtered"].mean() or 0.0), 3) if b.height else 0.0,
            difficulty=difficulty_means(valid["difficulty_json"].to_list()),
            response_tokens=round(statistics.fmean(len(x) for x in ro["completion_token_ids"].to_list()), 2) if ro.height else 0.0,
            validation_accuracy=validation[-1] if validation else float("nan"),
        ))
    return out
