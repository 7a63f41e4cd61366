"""The commands that run the co-evolution: run (sync or async, or resumed), config, plan, the ablation, a worker."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from engine.supervised import supervisor_gone
from lake import Lake, check_lake_root
from streams import kafka_bootstrap

from .app import app, experiment_app
from .options import (
    BootstrapOpt,
    ConfigOpt,
    LakeOpt,
    ProfileOpt,
    SetOpt,
    UserError,
    bad_input,
    check_output_folder,
    check_positive,
)
from .render import console, err, phases, run_summary, say, table


@app.command()
def run(
    lake: LakeOpt = "genenv-lake",
    bootstrap: BootstrapOpt = None,
    profile: ProfileOpt = "default",
    config: ConfigOpt = None,
    domain: Annotated[str | None, typer.Option(help="arith, toolcall or qa.")] = None,
    mode: Annotated[str | None, typer.Option(help="genenv, genenv-random, genenv-static or seeds-only.")] = None,
    epochs: Annotated[int | None, typer.Option(help="Epochs to run (0 with --async: until SIGTERM or Ctrl-C).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the run.")] = None,
    set_: SetOpt = None,
    report: Annotated[Path | None, typer.Option(help="Report folder (default: <lake>/reports/<run id>).")] = None,
    streaming: Annotated[
        bool, typer.Option("--async", help="Async mode: one worker process per role instead of the sync loop.")
    ] = False,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            help="Continue this run from what its lake holds, with its recorded config (with --async if it was an "
            "async run; a lost broker's events are sent again from the lake).",
        ),
    ] = None,
) -> None:
    """The main job: co-evolve the agent and the simulator, everything through Kafka and the lake, then write a report.

    Every option of a run (curriculum, GRPO and RWR options with TRL's names, sizes, models, warm start) is listed
    with its value by `genenv config --profile P`; put any of them in a TOML file for --config (configs/ has
    examples), or override one with --set name=value (section.name=value for curriculum, agent, env)."""
    from engine.coevolution import (
        CoEvolution,
        LakeWriter,
        check_async,
        check_machine,
        check_plan,
        load_config,
        recorded_run_config,
    )
    from engine.lineage import metrics_from_lake, with_measures, write_report

    flags = [
        f"{name}={value}"
        for name, value in (("domain", domain), ("mode", mode), ("epochs", epochs), ("seed", seed))
        if value is not None
    ]
    if resume is not None and (config is not None or flags or set_):
        raise UserError("--resume continues a run with its recorded config: drop --config, --set and the option flags")
    with bad_input():
        if resume is None:
            cfg = load_config(profile, config, flags + list(set_ or ()))
        else:
            cfg = recorded_run_config(Lake(lake, create=False), resume)
        if cfg.epochs == 0 and not streaming:
            raise ValueError("epochs = 0 (until stopped) is for async runs: add --async")
        if streaming:
            check_async(cfg)
        check_machine(cfg)  # the device, and vLLM where it is asked for: before the broker, the lake or a model
        check_plan(cfg, asynchronous=streaming)
    check_output_folder(report, "--report")
    check_lake_root(lake)
    with kafka_bootstrap(bootstrap) as servers, phases() as phase:
        lake_ = Lake(lake)
        console.print(
            f"{'async' if streaming else 'sync'} run: {cfg.domain}, {cfg.mode}, agent {cfg.agent_model}, "
            f"simulator {cfg.env_model}, {cfg.epochs} epochs, lake {lake_.root}"
        )
        if streaming:
            from engine.workers import RunInterrupted, run_async

            try:
                engine = run_async(
                    cfg,
                    lake_,
                    servers,
                    say=say,
                    phase=phase,
                    resume=resume is not None,
                    given_bootstrap=bootstrap,
                )
            except RunInterrupted as exc:  # the run stopped short: exit 1, with the --resume command to continue it
                err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
                raise typer.Exit(1) from None
            metrics = metrics_from_lake(lake_, engine.run_id)
        else:
            from kafka.errors import KafkaError

            engine = None
            try:
                with LakeWriter(lake_, servers) as writer:
                    engine = CoEvolution(cfg, lake_, writer, say=say, phase=phase)
                    metrics = engine.resume() if resume else engine.run()
            except KafkaError as exc:  # the broker went away mid-run: exit 1, with the command to continue it
                if engine is None:
                    raise
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                again = f"genenv run --resume {engine.run_id} --lake {lake_.root}"
                again += f" --bootstrap {bootstrap}" if bootstrap else ""
                err.print(
                    f"[bold red]error:[/] {escape(f'Kafka: {first}')}; what landed stays in the lake: continue the "
                    f"run with `{escape(again)}`",
                    highlight=False,
                )
                raise typer.Exit(1) from None
        if resume:
            metrics = metrics_from_lake(lake_, engine.run_id)  # every epoch, the ones before the resume too
        else:
            metrics = with_measures(metrics, lake_, engine.run_id)
    relative = f"reports/{engine.run_id}"
    page = write_report(
        report or lake_.files.local(relative),
        engine.run_id,
        cfg,
        metrics,
        engine.initial_accuracy,
        lake_.root,
        engine.initial_validation.by_level,
        engine.final_benchmark,
        engine.learning(),
        engine.validation_answers(),
    )
    if report is None and lake_.files.remote:
        lake_.files.upload_folder(relative)
        console.print(f"report uploaded to {lake_.root}/{relative}")
    console.print(run_summary(engine.run_id, metrics))
    console.print(f"report: {page}")


@app.command("config")
def show_config(profile: ProfileOpt = "default", config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Print every option of a run, with its value, as TOML: a starting point for `genenv run --config`."""
    from engine.coevolution import load_config, to_toml

    with bad_input():
        print(to_toml(load_config(profile, config, list(set_ or ()))), end="")


@app.command()
def plan(
    profile: ProfileOpt = "default",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    gpus: Annotated[int, typer.Option(help="Devices the trainer runs on.")] = 1,
    gpu_memory: Annotated[
        float | None, typer.Option(help="GiB per device (default: this machine's GPU, or its RAM).")
    ] = None,
    streaming: Annotated[
        bool, typer.Option("--async", help="Plan the async mode: every worker's models on the device at once.")
    ] = False,
) -> None:
    """The memory a run needs per device, by role and kind, and whether it fits: before anything is loaded.
    A role trained with FSDP (--set agent.fsdp=full_shard) has its weights, gradients and optimiser state
    divided over the --gpus devices; otherwise each device holds them whole (DDP)."""
    from engine.coevolution import load_config
    from trainers.plan import GIB, plan_run

    check_positive(gpus=gpus)
    with bad_input():
        cfg = load_config(profile, config, list(set_ or ()))
        # GPUs when this machine has one or --gpu-memory describes them, else this machine's CPU and RAM.
        device = "cuda" if gpu_memory is not None or cfg.device.startswith("cuda") or _has_cuda() else "cpu"
        the_plan = plan_run(cfg, gpus, gpu_memory, device=device, asynchronous=streaming)
    sharded = " FSDP" if cfg.agent.fsdp or cfg.env.fsdp else ""
    mode = ", async" if streaming else ""
    title = (
        f"memory plan: {profile}{mode}, {cfg.agent_model} / {cfg.env_model}, {the_plan.dtype}, "
        f"{gpus} x {device}{sharded}"
    )
    rows = [(role, what, f"{gib:.2f}") for role, what, gib in the_plan.rows()]
    out = table(title, ("role", "what", "GiB per device"), rows, numbers=1)
    out.add_row("peak", "", f"{the_plan.peak / GIB:.2f}", style="bold")
    console.print(out)
    console.print(escape(the_plan.verdict()))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@experiment_app.command("ablation")
def ablation(
    domain: Annotated[str, typer.Option(help="arith, toolcall or qa.")] = "toolcall",
    seeds: Annotated[int, typer.Option(help="Seeds per mode.")] = 5,
    modes: Annotated[
        str | None,
        typer.Option(
            help="The modes to compare, comma-separated (default: all four; genenv always runs: it makes "
            "each seed's warm start)."
        ),
    ] = None,
    lake: LakeOpt = "genenv-ablation-lake",
    bootstrap: BootstrapOpt = None,
    profile: ProfileOpt = "default",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option(help="Output folder (default: <lake>/reports/ablation-<domain>).")] = None,
    jobs: Annotated[
        int,
        typer.Option(
            help="Processes that run seeds side by side, each with its own local broker, lake (<lake>/job<i>) and "
            "share of the cores (each holds its own models: about 6 GB at the default). On 2 cores two jobs are "
            "slower than one."
        ),
    ] = 1,
    share_warm_start: Annotated[
        bool,
        typer.Option(
            help="Every seed starts from the first seed's warm start and validation before training (each job's "
            "first with --jobs): one warm start (about 3 min on 2 cores) and one 200-item validation an ablation "
            "instead of one a seed; the seeds then vary only the runs' sampling and order."
        ),
    ] = False,
) -> None:
    """genenv, genenv-random, genenv-static and seeds-only at equal rollout budget: a table and a plot."""
    from engine.coevolution import MODES, check_machine, load_config, run_ablation
    from engine.coevolution.experiment import cell
    from engine.lineage import with_measures

    check_positive(seeds=seeds, jobs=jobs)
    if jobs > 1 and bootstrap:
        raise UserError("--jobs runs each job with a broker of its own; leave --bootstrap out, or take --jobs 1")
    if jobs > (os.cpu_count() or 1):
        raise UserError(f"--jobs must be at most this machine's {os.cpu_count()} cores, got {jobs}")
    chosen = MODES if modes is None else tuple(dict.fromkeys(m.strip() for m in modes.split(",") if m.strip()))
    if not chosen or any(m not in MODES for m in chosen):
        raise UserError(f"--modes takes some of {', '.join(MODES)}, got {modes!r}")
    with bad_input():
        cfg = load_config(profile, config, [f"domain={domain}", *(set_ or ())])
        check_machine(cfg)
    check_output_folder(out, "--out")
    check_lake_root(lake)
    # with --jobs each job starts its own broker (engine/coevolution/experiment.py `run_jobs`)
    broker = kafka_bootstrap(bootstrap) if jobs == 1 else contextlib.nullcontext("")
    with broker as servers, phases() as phase:
        lake_ = Lake(lake)
        relative = f"reports/ablation-{cfg.domain}"
        folder = out or lake_.files.local(relative)
        result = run_ablation(
            cfg,
            seeds,
            lake_,
            servers,
            folder,
            say=say,
            modes=chosen,
            phase=phase,
            measure=with_measures,
            jobs=jobs,
            share_warm_start=share_warm_start,
        )
        if out is None and lake_.files.remote:
            lake_.files.upload_folder(relative)
            console.print(f"ablation report uploaded to {lake_.root}/{relative}")
    rows = [
        (mode, cell(t["validation_gain"], True), cell(t["in_band_last_half"]), cell(t["selection_bias"], True))
        for mode, t in result["modes"].items()
    ]
    title = f"ablation: {cfg.domain}, {seeds} seeds (mean [95% bootstrap interval])"
    console.print(table(title, ("mode", "validation gain", "in band, last half", "selection bias"), rows))
    console.print(f"table and plot: {folder}")


@app.command()
def worker(
    role: Annotated[
        str, typer.Argument(help="simulator, rollout, reward, train-agent or train-env (ingest: `genenv ingest`).")
    ],
    run_id: Annotated[str, typer.Option(help="The run this worker serves.")],
    lake: LakeOpt = "genenv-lake",
    bootstrap: BootstrapOpt = None,
    profile: ProfileOpt = "default",
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """One role of the async mode, as a long-running Kafka consumer (Ctrl-C or SIGTERM stops it)."""
    from engine.coevolution import check_async, check_machine, check_run_id, load_config
    from engine.workers import ROLES
    from engine.workers import worker as role_worker

    if role not in ROLES:
        raise UserError(
            f"unknown worker role {role!r}; roles: {', '.join(ROLES)} (the ingest worker is `genenv ingest`)"
        )
    with bad_input():
        check_run_id(run_id)
        cfg = load_config(profile, config, list(set_ or ()))
        check_async(cfg)
        check_machine(cfg)
    lake_ = Lake(lake, create=False)
    with kafka_bootstrap(bootstrap) as servers:
        role_worker(role, cfg, lake_, servers, run_id, say=say).run(stop=supervisor_gone)
