"""Running the async mode: the warm start, then one process per role, then a report read from the lake.

`genenv run --async` is a convenience for one machine: it starts the workers that a deployment would
run as separate services (`genenv worker ROLE` and `genenv ingest`, see docker-compose.yml), waits
until the agent trainer has made `epochs` updates and the simulator has written `epochs` rounds,
stops the other workers, lets the ingestor catch up with the log, and stops it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from lake import CHECKPOINTS, VALIDATIONS, Lake, lag, read_table, silver
from streams.broker import terminate

from ..coevolution import CoEvolution, LakeWriter, RunConfig, to_toml
from .worker import ROLES

ROOT = Path(__file__).resolve().parents[2]


def run_async(config: RunConfig, lake: Lake, bootstrap: str, say=print, timeout_s: float = 3600, phase=None) -> CoEvolution:
    """The run, its warm start and first validation done here (as the sync loop does them), the rest by workers."""
    with LakeWriter(lake, bootstrap) as writer:
        engine = CoEvolution(config, lake, writer, say, phase=phase)
        engine.prepare()
        if config.warm_start:
            engine.warm_start()
        engine.initial_accuracy = engine.validate()
        say(f"validation accuracy before training: {engine.initial_accuracy:.3f}")
    engine.rollouts.unload()  # the workers hold the models from here on
    engine.simulator.unload()
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
