"""Running the async mode: the warm start, then the workers under a supervisor, then a report read from the lake.

`genenv run --async` is a convenience for one machine: it starts the workers that a deployment would
run as separate services (`genenv worker ROLE` and `genenv ingest`, see docker-compose.yml), with
`rollout_workers` and `reward_workers` processes of those roles, restarts a worker that dies
(supervisor.py), waits until the agent trainer has made `epochs` updates and the simulator has written
`epochs` rounds, stops the other workers, lets the ingestor catch up with the log, and stops it. It
reports success only when the lake holds the whole run (`missing_work`). With `epochs = 0` it runs
until SIGTERM or Ctrl-C, then stops the same way; what was cut short is redone by `--resume`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import polars as pl

from lake import VALIDATIONS, Lake, RunRows, lag
from streams.broker import broker_answers
from trainers import manifest, new_rows, select_update_rows

from ..coevolution import CoEvolution, LakeWriter, RunConfig, run_version, to_toml
from .resume import republish
from .supervisor import Supervisor
from .worker import ROLES

BROKER_CHECK_S = 10.0  # how often the launcher asks whether the broker still answers


class RunInterrupted(RuntimeError):
    """The run cannot go on here (its broker stopped answering); the message says how to resume it."""


def run_async(
    config: RunConfig,
    lake: Lake,
    bootstrap: str,
    say=print,
    timeout_s: float = 3600,
    phase=None,
    resume: bool = False,
    given_bootstrap: str | None = None,
) -> CoEvolution:
    """The run, its warm start and first validation done here (as the sync loop does them), the rest by workers.
    resume: continue config.run_id from what the lake holds (resume.py): no warm start; the validation before
    training is measured again on the run's first agent checkpoint. given_bootstrap: the broker the user named, which
    the command to resume names again; None where the run started its own (a resume starts a fresh one)."""
    if resume:
        engine = CoEvolution(config, lake, None, say, run_id=config.run_id, phase=phase)
        engine.rollouts.load(lake, run_version(lake, "agent", config.run_id, first=True))
        engine.initial_validation = engine.validate()
        sent = republish(lake, bootstrap, engine.run_id)
        say(
            f"resuming run {engine.run_id}: "
            + (f"{sent} events of unfinished tasks sent again from the lake" if sent else "nothing to send again")
        )
    else:
        with LakeWriter(lake, bootstrap) as writer:
            engine = CoEvolution(config, lake, writer, say, phase=phase)
            engine.prepare()
            if config.warm_start:
                engine.warm_start()
            engine.initial_validation = engine.validate()
    say(f"validation accuracy before training: {engine.initial_accuracy:.3f}")
    engine.rollouts.release()  # the workers hold the models from here on
    engine.simulator.release()
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(to_toml(config))
    common = ["--lake", lake.root, "--bootstrap", bootstrap]
    run_id = engine.run_id
    supervisor = Supervisor(run_id, bootstrap, lambda: max(RunRows(lake, run_id).valid_per_epoch(), default=0), say)
    copies = {"rollout": config.rollout_workers, "reward": config.reward_workers}
    for role in ROLES:
        for i in range(copies.get(role, 1)):
            name = f"{role}-{i}" if copies.get(role, 1) > 1 else role
            supervisor.start(name, role, ["worker", role, *common, "--run-id", run_id, "--config", f.name])
    # Named after the run: its lease owner, so a restarted ingestor takes its own lease back at once.
    supervisor.start(f"ingest-{run_id}", "ingest", ["ingest", *common, "--max-batch-ms", "500"])
    deadline = time.monotonic() + (timeout_s if config.epochs else float("inf"))  # epochs 0: until stopped
    resume_line = f"genenv run --async --resume {run_id} --lake {lake.root}"
    resume_line += f" --bootstrap {given_bootstrap}" if given_bootstrap else ""

    def wait(until, what: str) -> None:
        asked = time.monotonic()
        while not until():
            supervisor.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"async run: {what} within {timeout_s:.0f}s")
            if time.monotonic() - asked > BROKER_CHECK_S:
                asked = time.monotonic()
                if not broker_answers(bootstrap):
                    raise RunInterrupted(
                        f"the Kafka broker at {bootstrap} stopped answering; continue the run with "
                        f"`{resume_line}` (against a new broker the lake re-sends what it lost)"
                    )
            time.sleep(1.0)

    stopped = False
    try:
        try:
            # The simulator has written every round; then every valid task gets scored, and the agent trainer
            # either makes its last update or has trained on everything the pool holds.
            wait(lambda: supervisor.finished("simulator"), "the simulator did not write its rounds")
            wait(
                lambda: lag(lake, bootstrap) == 0 and not _count(RunRows(lake, run_id).unscored_tasks()),
                "rewards did not land",
            )
            wait(
                lambda: supervisor.finished("train-agent") or _agent_caught_up(lake, run_id, config),
                "the agent trainer did not catch up",
            )
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (the CLI makes it an exit): a clean stop
            stopped = True
            say(
                f"stopping run {run_id}: the workers stop now and the ingestor lands what they published; "
                f"work cut short is done again by `{resume_line}`"
            )
        supervisor.stop("simulator", "rollout", "reward", "train-agent", "train-env")
        wait(lambda: lag(lake, bootstrap) == 0 and not _still_refining(lake), "the ingestor did not catch up")
    finally:
        supervisor.close()
        Path(f.name).unlink(missing_ok=True)
    missing = missing_work(lake, run_id, config)
    if missing and not stopped:
        raise RunInterrupted(
            f"async run {run_id}: the lake lacks {'; '.join(missing)}; continue it with `{resume_line}`"
        )
    if stopped:
        say(f"run {run_id} stopped" + (f"; unfinished: {'; '.join(missing)}" if missing else ""))
    elif config.final_bfcl_items:  # the newest agent checkpoint, as the sync loop does after its last epoch
        engine.rollouts.load(lake, run_version(lake, "agent", run_id))
        engine.final_benchmark = engine.benchmark()
        engine.rollouts.release()
    return engine


def missing_work(lake: Lake, run_id: str, config: RunConfig) -> list[str]:
    """What a finished run's lake should hold and does not: every valid task with group_size rollouts, each rollout
    with its reward, every task scored, and the agent trained at least once."""
    run = RunRows(lake, run_id)
    short = (
        run.tasks()
        .join(run.rollouts_per_task(), on="task_id", how="left")
        .filter(pl.col("len").fill_null(0) < config.group_size)
    )
    unrewarded = run.rollouts().join(run.rewards(), on="rollout_id", how="anti")
    problems = [
        f"{n} {what}"
        for n, what in (
            (_count(short), f"valid tasks with fewer than {config.group_size} rollouts"),
            (_count(unrewarded), "rollouts without a reward"),
            (_count(run.unscored_tasks()), "valid tasks without a score"),
        )
        if n
    ]
    if run_version(lake, "agent", run_id) == 0:
        problems.append("an agent checkpoint")
    return problems


def _count(rows: pl.LazyFrame) -> int:
    return rows.select(pl.len()).collect().item()


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
