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

from lake import VALIDATIONS, Lake, lag, read_table, silver
from streams.broker import terminate
from trainers import manifest, new_rows, select_update_rows

from ..coevolution import CoEvolution, LakeWriter, RunConfig, to_toml
from .worker import ROLES, run_version

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
        wait(lambda: procs["train-agent"].poll() is not None or _agent_caught_up(lake, engine.run_id, config),
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


def _agent_caught_up(lake: Lake, run_id: str, config: RunConfig) -> bool:
    """Nothing is left that the agent trainer would train on: every d_train row of the run is in the pool version
    its newest checkpoint read, or is one the trainer's own rule leaves out for that parent (rollouts more than
    agent.max_staleness versions behind it). Without the second half a run whose last rollouts all came from an
    older agent would wait for an update that can never happen."""
    parent = run_version(lake, "agent", run_id)
    if parent == 0:
        return False
    seen = manifest(lake, "agent", parent)["pool_version"]
    rows = new_rows(lake, "d_train", lake.version("gold/d_train"), seen).filter(pl.col("run_id") == run_id)
    selected, _ = select_update_rows("agent", rows, parent, config.agent, warm_start=False)
    return selected.is_empty()


def _still_refining(lake: Lake, quiet_s: float = 2.0) -> bool:
    """True while the ingestor is still committing refine steps (its commit record table keeps moving)."""
    before = lake.version(VALIDATIONS)
    time.sleep(quiet_s)
    return lake.version(VALIDATIONS) != before
