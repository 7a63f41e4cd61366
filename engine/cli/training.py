"""`genenv train`: one update of the agent or the simulator, in this process or in several (data-parallel).

With --num-processes N the command starts itself again under torchrun, N ranks, after resolving the pool version
and the parent once, so that every rank trains on the same rows from the same checkpoint (trainers/distributed.py
sets accelerate up inside each rank). torchrun rather than `accelerate launch`: with `--cpu`, accelerate's
launcher starts several processes only through MPI (a hostfile and mpirun), and without it, only on GPUs, where it
runs torchrun underneath anyway. On a GPU machine `accelerate launch -m engine.cli train ...` works as well.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Annotated

import typer

from lake import Lake
from streams import configured_bootstrap, kafka_bootstrap, require_broker

from .app import app
from .options import BootstrapOpt, LakeOpt, UserError, bad_input, check_positive
from .render import console, phases, record_table


@app.command()
def train(
    kind: Annotated[str, typer.Argument(help="agent (GRPO on gold/d_train) or env (RWR on gold/d_env).")],
    lake: LakeOpt = "genenv-lake",
    pool_version: Annotated[int | None, typer.Option(help="Delta version of the pool (default: the latest).")] = None,
    parent: Annotated[
        int | None, typer.Option(help="Checkpoint version to start from (default: the newest; 0: the base model).")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Base model when no checkpoint exists yet (a built-in name, path or hub id).")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="A trainer option as name=value (TRL names: learning_rate, beta, epsilon, "
            "loss_type, ...); repeatable.",
        ),
    ] = None,
    run_id: Annotated[str, typer.Option(help="Run id stamped on the CheckpointPublished event.")] = "manual",
    epoch: Annotated[int, typer.Option(help="Epoch stamped on the event.")] = 0,
    bootstrap: BootstrapOpt = None,
    num_processes: Annotated[
        int, typer.Option(help="Processes of one data-parallel update (torchrun: gloo on CPUs, NCCL on GPUs).")
    ] = 1,
) -> None:
    """One update: train the agent or the simulator on its pool, write a checkpoint, publish and register it. Its
    options are those of the nearest update in the parent's lineage (the run it extends), or the defaults; --set
    changes them."""
    from engine.coevolution import publish_checkpoint
    from engine.coevolution.overrides import apply_overrides
    from trainers import KINDS, POOL_OF, default_config, inherited_config, latest_version, train_update
    from trainers.distributed import check_sharding, world_size
    from trainers.models import Precision

    if kind not in KINDS:
        raise UserError(f"unknown model kind {kind!r}; kinds: {', '.join(KINDS)}")
    check_positive(num_processes=num_processes)
    sets = list(set_ or ())
    with bad_input():  # the options first, on the defaults: a bad one stops before the lake is opened
        config = apply_overrides(default_config(kind), sets)
        config.check()
        if num_processes > 1:
            check_sharding(config.fsdp, Precision().resolved().device)
    lake_ = Lake(lake, create=False)
    start = latest_version(lake_, kind) if parent is None else parent
    with bad_input():
        config, inherited_from = inherited_config(lake_, kind, start)
        source = None if inherited_from is None else f"{kind} v{inherited_from}'s update"
        if inherited_from is None and start > 0:  # a lineage of warm starts alone: its run's options, if recorded
            config, source = run_options(lake_, kind, start) or (config, None)
        config = apply_overrides(config, sets)
        config.check()
    if source is not None and world_size() == 1:
        console.print(f"options: those of {source}" + (", with --set" if sets else ""))
    if configured_bootstrap(bootstrap):
        require_broker(configured_bootstrap(bootstrap))  # before training: its checkpoint must be publishable
    if num_processes > 1 and world_size() == 1:
        pool_version = lake_.version(f"gold/{POOL_OF[kind]}") if pool_version is None else pool_version
        parent = latest_version(lake_, kind) if parent is None else parent
        resolved = [
            "--pool-version",
            str(pool_version),
            "--parent",
            str(parent),
            "--run-id",
            run_id,
            "--epoch",
            str(epoch),
            "--lake",
            str(lake),
        ]
        more = [*(["--model", model] if model else []), *(["--bootstrap", bootstrap] if bootstrap else [])]
        ranks = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={num_processes}",
            "-m",
            "engine.cli",
            "train",
            kind,
            *resolved,
            *more,
            *[a for item in sets for a in ("--set", item)],
        ]
        raise typer.Exit(subprocess.call(ranks))
    with phases() as phase, phase(f"training {kind}") as tick:
        record = train_update(
            kind, lake_, config, base_model=model, pool_version=pool_version, parent_version=parent, progress=tick
        )
    if int(os.environ.get("RANK", "0")) != 0:
        return  # rank 0 wrote the checkpoint; it publishes it too
    with kafka_bootstrap(bootstrap) as servers, console.status(f"publishing {kind} v{record.version}"):
        publish_checkpoint(lake_, servers, record, run_id, epoch)
    console.print(record_table(record))


def run_options(lake: Lake, kind: str, version: int):
    """(the trainer options of the run that registered checkpoint `version`, as its recorded configuration has them,
    and where they came from), or None where that run recorded none (a checkpoint trained by hand). The first update
    after a warm start so continues its run: the simulator scored at the temperature the run samples it at, not at
    RWRConfig's default."""
    from engine.coevolution import recorded_run_config, run_config_path
    from trainers import registered

    run_id = registered(lake, kind, version)["run_id"]
    if lake.files.read_text(run_config_path(run_id)) is None:
        return None
    run = recorded_run_config(lake, run_id)
    return (run.agent if kind == "agent" else run.env), f"run {run_id}'s configuration"
