"""The `genenv` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engine.supervised import supervisor_gone
from lake import (
    IngestConfig, Lake, LakeError, LeaseHeld, StorageError, check_lake_root, quarantine_by_reason, status, versions,
)
from lake import ingest as run_ingest
from streams import (
    BOOTSTRAP_ENV, BrokerError, LocalBroker, configured_bootstrap, ensure_topics, kafka_bootstrap, require_broker,
)

app = typer.Typer(help="GenEnv: co-evolving agents and environment simulators, as an event-sourced curriculum engine.",
                  no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_enable=False)
lake_app = typer.Typer(help="Inspect the Delta lake: tables, versions, quarantine.", no_args_is_help=True)
app.add_typer(lake_app, name="lake")
experiment_app = typer.Typer(help="Experiments over several runs.", no_args_is_help=True)
app.add_typer(experiment_app, name="experiment")
audit_app = typer.Typer(help="Where a task, checkpoint or epoch came from and what it caused.", no_args_is_help=True)
app.add_typer(audit_app, name="audit")
console = Console()
err = Console(stderr=True, soft_wrap=True)

LakeOpt = Annotated[str, typer.Option("--lake", help="Lake root: a directory, or s3://bucket/prefix (storage options from AWS_* variables).")]
BootstrapOpt = Annotated[Optional[str], typer.Option(
    "--bootstrap", help=f"Kafka bootstrap servers; default ${BOOTSTRAP_ENV}, else a local broker for the run.")]


class UserError(Exception):
    """A bad flag, path or config: reported as one line, exit code 2."""


@app.command()
def broker(port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0: a free one).")] = 0) -> None:
    """Run a local Kafka-compatible broker (Tansu) in the foreground and print its address."""
    _check_port(port, allow_zero=True)
    with LocalBroker(port or None) as local:
        ensure_topics(local.bootstrap)
        console.print(f"broker listening on [bold]{local.bootstrap}[/] (export {BOOTSTRAP_ENV}={local.bootstrap}); Ctrl-C stops it")
        print(local.bootstrap, flush=True)
        while local.running:
            time.sleep(0.5)


@app.command()
def ingest(
    lake: LakeOpt = "genenv-lake",
    bootstrap: BootstrapOpt = None,
    idle_exit: Annotated[Optional[float], typer.Option(help="Stop after this many idle seconds (default: run forever).")] = None,
    max_batch_records: Annotated[int, typer.Option(help="Records per micro-batch at most.")] = 20_000,
    max_batch_ms: Annotated[int, typer.Option(help="Milliseconds a micro-batch stays open at most.")] = 1_000,
    max_wait: Annotated[float, typer.Option(help="Seconds a rollout/reward waits for its task before quarantine.")] = 30.0,
    partitions: Annotated[int, typer.Option(help="Partitions per topic when topics are created.")] = 3,
    lease_ttl: Annotated[float, typer.Option(help="Seconds after which a dead ingestor's lease on the lake lapses (it renews every third of that).")] = 30.0,
) -> None:
    """Consume the genenv topics into the lake exactly once: bronze, validated silver, quarantine, gold pools.
    One ingestor per lake: a second one stops at start, naming the one that holds the lake's lease."""
    config = IngestConfig(max_batch_records=max_batch_records, max_batch_ms=max_batch_ms, max_wait_s=max_wait,
                          partitions=partitions, lease_ttl_s=lease_ttl)
    _check_positive(max_batch_records=max_batch_records, max_batch_ms=max_batch_ms, partitions=partitions,
                    lease_ttl=lease_ttl)
    _check_non_negative(max_wait=max_wait, idle_exit=idle_exit)
    check_lake_root(lake)
    with kafka_bootstrap(bootstrap) as servers, console.status("ingesting") as spinner:
        lake_ = Lake(lake)  # created once the broker answers: a bad invocation leaves nothing behind

        def progress(stats):
            spinner.update(f"ingested {stats.records:,} records in {stats.steps} steps")

        stats = run_ingest(lake_, servers, config, idle_exit_s=idle_exit, on_step=progress, stop=supervisor_gone)
    console.print(stats.summary())


@lake_app.command("prune")
def lake_prune(
    lake: LakeOpt = "genenv-lake",
    keep_last: Annotated[int, typer.Option(help="Versions of each kind kept, newest first.")] = 3,
    keep_every: Annotated[int, typer.Option(help="Also keep every K-th version (0: none).")] = 0,
    apply: Annotated[bool, typer.Option("--apply", help="Delete the folders; without it, only say what would go.")] = False,
) -> None:
    """Delete old checkpoint folders: keep the last N, every K-th, and each kept version's parent (a replay
    retrains from it); registry rows, and so every version's lineage, stay."""
    from trainers import KINDS
    from trainers.retention import apply_retention, plan_retention

    _check_positive(keep_last=keep_last)
    _check_non_negative(keep_every=keep_every)
    lake_ = Lake(lake, create=False)
    for kind in KINDS:
        plan = plan_retention(lake_, kind, keep_last, keep_every)
        table = Table(title=f"{kind} checkpoints{'' if apply else ' (dry run: --apply deletes)'}")
        table.add_column("version", justify="right")
        table.add_column("folder")
        table.add_column("why")
        for version, why in plan.keep.items():
            table.add_row(str(version), "kept", why)
        for version in plan.delete:
            table.add_row(str(version), "deleted" if apply else "would be deleted", "older than every reason to keep it")
        console.print(table)
        if apply:
            apply_retention(lake_, plan)


@lake_app.command("status")
def lake_status(lake: LakeOpt = "genenv-lake") -> None:
    """Each table with its version and row count, and the quarantine by reason."""
    lake_ = Lake(lake, create=False)
    table = Table(title=f"lake {lake_.root}")
    for column in ("table", "version", "rows"):
        table.add_column(column, justify="left" if column == "table" else "right")
    for row in status(lake_):
        table.add_row(row["table"], str(row["version"]), f"{row['rows']:,}")
    console.print(table)
    reasons = quarantine_by_reason(lake_)
    if reasons:
        q = Table(title="quarantine by reason")
        q.add_column("reason")
        q.add_column("rows", justify="right")
        for reason, count in reasons.most_common():
            q.add_row(reason, f"{count:,}")
        console.print(q)


@lake_app.command("versions")
def lake_versions(table: str, lake: LakeOpt = "genenv-lake") -> None:
    """The versions of one table with their commit metadata."""
    out = Table(title=table)
    for column in ("version", "time", "operation", "metadata"):
        out.add_column(column)
    for v in versions(Lake(lake, create=False), table):
        out.add_row(str(v.version), v.timestamp.isoformat(timespec="seconds"), v.operation, str(v.metadata)[:120])
    console.print(out)


@app.command()
def run(
    lake: LakeOpt = "genenv-lake",
    bootstrap: BootstrapOpt = None,
    profile: Annotated[str, typer.Option(help="quick (tiny models, ~1 min), default (smollm2-135m on CPU), paper (GPU settings).")] = "default",
    config: Annotated[Optional[Path], typer.Option("--config", help="A TOML file with any of the options (see `genenv config`).")] = None,
    domain: Annotated[Optional[str], typer.Option(help="arith, toolcall or qa.")] = None,
    mode: Annotated[Optional[str], typer.Option(help="genenv, genenv-random, genenv-static or seeds-only.")] = None,
    epochs: Annotated[Optional[int], typer.Option(help="Epochs to run (0 with --async: until stopped by SIGTERM or Ctrl-C).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the run.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Any option as name=value or section.name=value (sections: curriculum, agent, env); repeatable.")] = [],
    report: Annotated[Optional[Path], typer.Option(help="Report folder (default: <lake>/reports/<run id>).")] = None,
    streaming: Annotated[bool, typer.Option("--async", help="Async mode: one worker process per role instead of the sync loop.")] = False,
    resume: Annotated[Optional[str], typer.Option("--resume", help="Continue this run from what its lake holds, with its recorded config (with --async if it was an async run; a lost broker's events are sent again from the lake).")] = None,
) -> None:
    """The main job: co-evolve the agent and the simulator, everything through Kafka and the lake, then write a report.

    Every option of a run (curriculum alpha/beta/k/granularity, GRPO and RWR options with TRL's names, sizes, models, warm start) is listed with its value by `genenv config --profile P`; put any of them in a TOML file for --config, or override one with --set name=value (section.name=value for curriculum, agent, env)."""
    from engine.coevolution import CoEvolution, LakeWriter, check_machine, check_plan, load_config, recorded_run_config
    from engine.lineage import metrics_from_lake, with_measures, write_report

    flags = [f"{name}={value}" for name, value in (("domain", domain), ("mode", mode), ("epochs", epochs), ("seed", seed))
             if value is not None]
    if resume is not None:
        if config is not None or flags or set_:
            raise UserError("--resume continues a run with its recorded config: drop --config, --set and the option flags")
    try:
        cfg = (load_config(profile, config, flags + list(set_)) if resume is None
               else recorded_run_config(Lake(lake, create=False), resume))
        if cfg.epochs == 0 and not streaming:
            raise ValueError("epochs = 0 (until stopped) is for async runs: add --async")
        check_machine(cfg)  # the device, and vLLM where it is asked for: before the broker, the lake or a model
        check_plan(cfg)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    check_lake_root(lake)
    with kafka_bootstrap(bootstrap) as servers, _phases() as phase:
        lake_ = Lake(lake)
        console.print(f"{'async' if streaming else 'sync'} run: {cfg.domain}, {cfg.mode}, agent {cfg.agent_model}, "
                      f"simulator {cfg.env_model}, {cfg.epochs} epochs, lake {lake_.root}")
        if streaming:
            from engine.workers import RunInterrupted, run_async

            try:
                engine = run_async(cfg, lake_, servers, say=console.print, phase=phase, resume=resume is not None)
            except RunInterrupted as exc:
                err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
                raise typer.Exit(1) from None
            metrics = metrics_from_lake(lake_, engine.run_id)
        else:
            with LakeWriter(lake_, servers) as writer:
                engine = CoEvolution(cfg, lake_, writer, say=console.print, phase=phase)
                metrics = engine.resume() if resume else engine.run()
        if resume:
            metrics = metrics_from_lake(lake_, engine.run_id)  # every epoch, the ones before the resume too
        else:
            metrics = with_measures(metrics, lake_, engine.run_id)
    relative = f"reports/{engine.run_id}"
    page = write_report(report or lake_.files.local(relative), engine.run_id, cfg, metrics, engine.initial_accuracy,
                        lake_.root, engine.initial_validation.by_level, engine.final_benchmark, engine.learning())
    if report is None and lake_.files.remote:
        lake_.files.upload_folder(relative)
        console.print(f"report uploaded to {lake_.root}/{relative}")
    summary = Table(title=f"run {engine.run_id}")
    for column in ("epoch", "agent v", "env v", "valid", "agent success", "in band", "validation acc"):
        summary.add_column(column, justify="right")
    for m in metrics:
        summary.add_row(str(m.epoch), str(m.agent_version), str(m.env_version), f"{m.valid_share:.2f}",
                        f"{m.agent_success:.2f}", f"{m.in_band_share:.2f}", f"{m.validation_accuracy:.3f}")
    console.print(summary)
    console.print(f"report: {page}")


@app.command("config")
def show_config(
    profile: Annotated[str, typer.Option(help="quick, default or paper.")] = "default",
    config: Annotated[Optional[Path], typer.Option("--config", help="A TOML file to layer on the profile.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="An option as name=value; repeatable.")] = [],
) -> None:
    """Print every option of a run, with its value, as TOML: a starting point for `genenv run --config`."""
    from engine.coevolution import load_config, to_toml

    try:
        print(to_toml(load_config(profile, config, list(set_))), end="")
    except ValueError as exc:
        raise UserError(str(exc)) from None


@app.command()
def plan(
    profile: Annotated[str, typer.Option(help="quick, default or paper.")] = "default",
    config: Annotated[Optional[Path], typer.Option("--config", help="A TOML file to layer on the profile.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="An option as name=value; repeatable.")] = [],
    gpus: Annotated[int, typer.Option(help="Devices the trainer runs on.")] = 1,
    gpu_memory: Annotated[Optional[float], typer.Option(help="GiB per device (default: this machine's GPU, or its RAM).")] = None,
) -> None:
    """The memory a run needs per device, by role and kind, and whether it fits: before anything is loaded.
    A role trained with FSDP (--set agent.fsdp=full_shard) has its weights, gradients and optimiser state
    divided over the --gpus devices; otherwise each device holds them whole (DDP)."""
    from engine.coevolution import load_config
    from trainers.plan import GIB, plan_run

    _check_positive(gpus=gpus)
    try:
        cfg = load_config(profile, config, list(set_))
        # GPUs when this machine has one or --gpu-memory describes them, else this machine's CPU and RAM.
        device = "cuda" if gpu_memory is not None or cfg.device.startswith("cuda") or _has_cuda() else "cpu"
        the_plan = plan_run(cfg, gpus, gpu_memory, device=device)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    table = Table(title=f"memory plan: {profile}, {cfg.agent_model} / {cfg.env_model}, {the_plan.dtype}, "
                        f"{gpus} x {device}{' FSDP' if cfg.agent.fsdp or cfg.env.fsdp else ''}")
    for column, justify in (("role", "left"), ("what", "left"), ("GiB per device", "right")):
        table.add_column(column, justify=justify)
    for role, what, gib in the_plan.rows():
        table.add_row(role, what, f"{gib:.2f}")
    table.add_row("peak", "", f"{the_plan.peak / GIB:.2f}", style="bold")
    console.print(table)
    console.print(escape(the_plan.verdict()))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@experiment_app.command("ablation")
def ablation(
    domain: Annotated[str, typer.Option(help="arith, toolcall or qa.")] = "toolcall",
    seeds: Annotated[int, typer.Option(help="Seeds per mode.")] = 5,
    modes: Annotated[Optional[str], typer.Option(help="The modes to compare, comma-separated (default: all four; genenv always runs: it makes each seed's warm start).")] = None,
    lake: LakeOpt = "genenv-ablation-lake",
    bootstrap: BootstrapOpt = None,
    profile: Annotated[str, typer.Option(help="Profile the runs start from.")] = "default",
    config: Annotated[Optional[Path], typer.Option("--config", help="A TOML file with the runs' options.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="An option as name=value; repeatable.")] = [],
    out: Annotated[Optional[Path], typer.Option(help="Output folder (default: <lake>/reports/ablation-<domain>).")] = None,
) -> None:
    """genenv, genenv-random, genenv-static and seeds-only at equal rollout budget: a table and a plot."""
    from engine.coevolution import MODES, load_config, run_ablation
    from engine.lineage import with_measures

    _check_positive(seeds=seeds)
    chosen = MODES if modes is None else tuple(dict.fromkeys(m.strip() for m in modes.split(",") if m.strip()))
    unknown = [m for m in chosen if m not in MODES]
    if unknown or not chosen:
        raise UserError(f"--modes takes some of {', '.join(MODES)}, got {modes!r}")
    try:
        cfg = load_config(profile, config, [f"domain={domain}", *set_])
    except ValueError as exc:
        raise UserError(str(exc)) from None
    check_lake_root(lake)
    with kafka_bootstrap(bootstrap) as servers, _phases() as phase:
        lake_ = Lake(lake)
        relative = f"reports/ablation-{cfg.domain}"
        folder = out or lake_.files.local(relative)
        table = run_ablation(cfg, seeds, lake_, servers, folder, say=console.print, modes=chosen, phase=phase,
                             measure=with_measures)
        if out is None and lake_.files.remote:
            lake_.files.upload_folder(relative)
            console.print(f"ablation report uploaded to {lake_.root}/{relative}")
    from engine.coevolution.experiment import cell

    summary = Table(title=f"ablation: {cfg.domain}, {seeds} seeds (mean [95% bootstrap interval])")
    for column in ("mode", "validation gain", "in band, last half", "selection bias"):
        summary.add_column(column)
    for mode, t in table["modes"].items():
        summary.add_row(mode, cell(t["validation_gain"], True), cell(t["in_band_last_half"]), cell(t["selection_bias"], True))
    console.print(summary)
    console.print(f"table and plot: {folder}")


@app.command()
def worker(
    role: Annotated[str, typer.Argument(help="simulator, rollout, reward, train-agent or train-env (the ingest worker is `genenv ingest`).")],
    run_id: Annotated[str, typer.Option(help="The run this worker serves.")],
    lake: LakeOpt = "genenv-lake",
    bootstrap: BootstrapOpt = None,
    profile: Annotated[str, typer.Option(help="Profile the options start from.")] = "default",
    config: Annotated[Optional[Path], typer.Option("--config", help="A TOML file with the run's options.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="An option as name=value; repeatable.")] = [],
) -> None:
    """One role of the async mode, as a long-running Kafka consumer (Ctrl-C or SIGTERM stops it)."""
    from engine.coevolution import check_machine, check_run_id, load_config
    from engine.workers import ROLES, worker as role_worker

    if role not in ROLES:
        raise UserError(f"unknown worker role {role!r}; roles: {', '.join(ROLES)} (the ingest worker is `genenv ingest`)")
    try:
        check_run_id(run_id)
        cfg = load_config(profile, config, list(set_))
        check_machine(cfg)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    lake_ = Lake(lake, create=False)
    with kafka_bootstrap(bootstrap) as servers:
        role_worker(role, cfg, lake_, servers, run_id, say=console.print).run(stop=supervisor_gone)


@app.command()
def train(
    kind: Annotated[str, typer.Argument(help="agent (GRPO on gold/d_train) or env (RWR on gold/d_env).")],
    lake: LakeOpt = "genenv-lake",
    pool_version: Annotated[Optional[int], typer.Option(help="Delta version of the pool to train on (default: the latest).")] = None,
    parent: Annotated[Optional[int], typer.Option(help="Checkpoint version to start from (default: the newest; 0: the base model).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Base model when no checkpoint exists yet (a built-in name, path or hub id).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="A trainer option as name=value (TRL names: learning_rate, beta, epsilon, loss_type, ...); repeatable.")] = [],
    run_id: Annotated[str, typer.Option(help="Run id stamped on the CheckpointPublished event.")] = "manual",
    epoch: Annotated[int, typer.Option(help="Epoch stamped on the event.")] = 0,
    bootstrap: BootstrapOpt = None,
    num_processes: Annotated[int, typer.Option(help="Processes of one data-parallel update (torchrun and accelerate: gloo on CPUs, NCCL on GPUs).")] = 1,
) -> None:
    """One update: train the agent or the simulator on its pool, write a checkpoint, publish and register it."""
    from engine.coevolution import publish_checkpoint
    from engine.coevolution.overrides import OverrideError, apply_overrides
    from trainers import KINDS, POOL_OF, CheckpointError, ModelNotFound, TrainError, default_config, latest_version, train_update
    from trainers.distributed import check_sharding, world_size
    from trainers.models import Precision

    if kind not in KINDS:
        raise UserError(f"unknown model kind {kind!r}; kinds: {', '.join(KINDS)}")
    _check_positive(num_processes=num_processes)
    try:
        config = apply_overrides(default_config(kind), set_)
        config.check()
        if num_processes > 1:
            check_sharding(config.fsdp, Precision().resolved().device)
    except (OverrideError, ValueError) as exc:
        raise UserError(str(exc)) from None
    lake_ = Lake(lake, create=False)
    if configured_bootstrap(bootstrap):
        require_broker(configured_bootstrap(bootstrap))  # before training: its checkpoint must be publishable
    if num_processes > 1 and world_size() == 1:
        # Every rank must read the same pool version and parent: resolved here, once, then passed to each.
        pool_version = lake_.version(f"gold/{POOL_OF[kind]}") if pool_version is None else pool_version
        parent = latest_version(lake_, kind) if parent is None else parent
        ranks = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={num_processes}",
                 "-m", "engine.cli", "train", kind, "--lake", str(lake), "--pool-version", str(pool_version),
                 "--parent", str(parent), "--run-id", run_id, "--epoch", str(epoch),
                 *(["--model", model] if model else []), *[a for item in set_ for a in ("--set", item)],
                 *(["--bootstrap", bootstrap] if bootstrap else [])]
        raise typer.Exit(subprocess.call(ranks))
    rank = int(os.environ.get("RANK", "0"))
    with _phases() as phase, phase(f"training {kind}") as tick:
        try:
            record = train_update(kind, lake_, config, base_model=model, pool_version=pool_version, parent_version=parent,
                                  progress=tick)
        except (TrainError, CheckpointError, ModelNotFound) as exc:
            raise UserError(str(exc)) from None
    if rank != 0:
        return  # rank 0 wrote the checkpoint; it publishes it too
    with kafka_bootstrap(bootstrap) as servers, console.status(f"publishing {kind} v{record.version}"):
        publish_checkpoint(lake_, servers, record, run_id, epoch)
    summary = Table(title=f"{kind} v{record.version}")
    summary.add_column("field")
    summary.add_column("value")
    for name in ("parent_version", "base_model", "pool_table", "pool_version", "seed", "config_hash", "sha256", "path"):
        summary.add_row(name, str(getattr(record, name)))
    for name, value in record.metrics.items():
        summary.add_row(name, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(summary)


@app.command()
def ui(
    lake: LakeOpt = "genenv-lake",
    host: Annotated[str, typer.Option(help="Address to listen on (keep 127.0.0.1 unless you mean to share it).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8765,
) -> None:
    """A read-only web view of the lake: runs, epochs with metrics and plots, a task browser with each task's
    lineage, the quarantine with reasons. Ctrl-C stops it."""
    from engine.lineage import serve

    _check_port(port)
    lake_ = Lake(lake, create=False)
    console.print(f"genenv ui for {lake_.root} on [bold]http://{host}:{port}/[/] (read only; Ctrl-C stops it)")
    try:
        serve(lake_, host, port)
    except OSError as exc:  # the address is taken, or not this machine's
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


@app.command("eval")
def eval_(
    benchmark: Annotated[str, typer.Option(help="bfcl, api-bank, bamboogle, alfworld, travelplanner or all.")],
    model: Annotated[str, typer.Option(help="A built-in model name, folder, GGUF file or hub id, or a registered checkpoint: agent:vN, agent:latest.")],
    limit: Annotated[Optional[int], typer.Option(help="Items per benchmark at most (BFCL: per category; ALFWorld: games, every task type sampled).")] = None,
    data: Annotated[Optional[Path], typer.Option(help="Folder holding api-bank/, bamboogle/, alfworld/, travelplanner/ (default: the repository's data/; BFCL's data comes with bfcl-eval).")] = None,
    lake: LakeOpt = "genenv-lake",
    batch_size: Annotated[int, typer.Option(help="Prompts generated at once.")] = 16,
    bfcl_reading: Annotated[str, typer.Option("--bfcl-reading", help="How BFCL answers are read: bfcl (bfcl-eval's default decoder, as the leaderboard scores) or lenient (also ```python fences and one call per line; the results' scoring names it).")] = "bfcl",
) -> None:
    """Evaluate a model or checkpoint offline on the GenEnv paper's benchmarks; results go to the lake's
    eval/results and eval/items tables and to a table here (with the paper's 7B figures beside the headline)."""
    from engine.benchmarks import BENCHMARKS, PAPER, DataMissing, EvalError, benchmark_names, evaluate, model_agent, record
    from trainers import CheckpointError, ModelNotFound

    if limit is not None:
        _check_positive(limit=limit)
    _check_positive(batch_size=batch_size)
    if data is not None and not data.is_dir():
        raise UserError(f"--data {data} is not a folder")
    check_lake_root(lake)
    try:
        names = benchmark_names(benchmark)
        # Every benchmark's data is read before any model is loaded: a missing file stops here.
        loaded = {}
        for name in names:
            bench = BENCHMARKS[name](reading=bfcl_reading) if name == "bfcl" else BENCHMARKS[name]()
            loaded[name] = (bench, bench.load(data, limit))
    except (EvalError, DataMissing, ValueError) as exc:
        raise UserError(str(exc)) from None
    lake_ = Lake(lake)
    try:
        agent = model_agent(model, lake_, batch_size)
    except (EvalError, CheckpointError, ModelNotFound) as exc:
        raise UserError(str(exc)) from None
    summary = Table(title=f"eval of {agent.version}")
    for column in ("benchmark", "metric", "value", "paper (GenEnv 7B)"):
        summary.add_column(column)
    with _phases() as phase:
        for name, (bench, items) in loaded.items():
            with phase(f"{name}: {len(items)} items") as tick:
                report = evaluate(name, agent, model, data, limit, tick, bench, items)
            record(lake_, report)
            for metric, value in report.metrics.items():
                paper = f"{PAPER[name]}" if metric == bench.headline else ""
                shown = f"{100 * value:.1f}" if isinstance(value, float) and metric != "items" else str(value)
                summary.add_row(name, metric, shown, paper)
            console.print(f"{name}: {len(items)} items in {report.seconds:.0f}s; scoring: {report.scoring}")
    console.print(summary)
    console.print(f"results: {lake_.root}/eval/results and eval/items (eval ids by benchmark in the table's eval_id)")


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")]
RunOpt = Annotated[Optional[str], typer.Option("--run", help="Run id (default: the newest run in the lake).")]


def _audited(fn, *args):
    from engine.lineage import AuditError
    from trainers import CheckpointError

    try:
        return fn(*args)
    except (AuditError, CheckpointError) as exc:
        raise UserError(str(exc)) from None


def _show(answer: dict, as_json: bool, title: str) -> None:
    """An audit answer: JSON, or a two-column table whose nested values are printed as compact JSON."""
    import json

    if as_json:
        print(json.dumps(answer, indent=2, default=str))
        return
    out = Table(title=title, show_lines=True)
    out.add_column("field", style="bold")
    out.add_column("value", overflow="fold")
    for name, value in answer.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            value = "\n".join(json.dumps(item, default=str) for item in value)
        elif isinstance(value, (dict, list)):
            value = json.dumps(value, default=str)
        out.add_row(name, str(value))
    console.print(out)


@audit_app.command("task")
def audit_task(task_id: Annotated[str, typer.Argument(help="A task id (see `genenv audit epoch`).")],
               lake: LakeOpt = "genenv-lake", as_json: JsonOpt = False) -> None:
    """The whole life of one task: prompt and generation, validation, rollouts with rewards, its batch's
    p_hat and R_env, the pool versions that hold it, the checkpoints trained on them."""
    from engine.lineage import audit_task as audit

    _show(_audited(audit, Lake(lake, create=False), task_id), as_json, f"task {task_id}")


@audit_app.command("checkpoint")
def audit_checkpoint(kind: Annotated[str, typer.Argument(help="agent or env.")],
                     version: Annotated[int, typer.Argument(help="Registered version.")],
                     lake: LakeOpt = "genenv-lake", as_json: JsonOpt = False) -> None:
    """A checkpoint's parents back to the base model, the pool rows each update trained on, its metrics."""
    from engine.lineage import audit_checkpoint as audit

    _show(_audited(audit, Lake(lake, create=False), kind, version), as_json, f"{kind} v{version}")


@audit_app.command("epoch")
def audit_epoch(epoch: Annotated[int, typer.Argument(help="Epoch number (0 includes the warm start).")],
                lake: LakeOpt = "genenv-lake", run: RunOpt = None, as_json: JsonOpt = False) -> None:
    """One epoch of a run: tasks, valid share, quarantine by reason, agent success, share in band, the curriculum's
    measures (selection bias, levels chosen and offered, informative groups per 100 rollouts, success per level),
    checkpoints, and the workers the supervisor restarted."""
    from engine.lineage import audit_epoch as audit

    answer = _audited(audit, Lake(lake, create=False), epoch, run)
    _show(answer, as_json, f"run {answer['run_id']}, epoch {epoch}")


@app.command()
def replay(
    epoch: Annotated[int, typer.Option("--epoch", help="The epoch to replay (0 includes the warm start).")],
    lake: LakeOpt = "genenv-lake",
    run: RunOpt = None,
    rescore: Annotated[bool, typer.Option("--rescore", help="Also re-run the domain checker and report the rewards, p_hat values and filter decisions that would change.")] = False,
    scratch: Annotated[Optional[Path], typer.Option(help="Keep the rebuilt lake in this (new) folder (default: a temporary folder, removed).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay an epoch: rebuild it from the bronze log, retrain its checkpoints, check their sha256 (exit 1 if any differs).

    The run's bronze records are refined into a scratch lake up to what each update read; each checkpoint is
    retrained from its recorded parent with the config and seed in its genenv.json."""
    import dataclasses
    import json

    from engine.lineage import ReplayError, replay_epoch
    from trainers import CheckpointError

    if scratch is not None and scratch.exists() and not scratch.is_dir():
        raise UserError(f"--scratch {scratch} is a file; name a new folder")
    lake_ = Lake(lake, create=False)
    try:
        with _phases() as phase:
            result = replay_epoch(lake_, epoch, run, scratch, rescore, say=console.print, phase=phase)
    except (ReplayError, CheckpointError) as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(json.dumps({**dataclasses.asdict(result), "ok": result.ok}, indent=2, default=str))
    else:
        out = Table(title=f"replay of run {result.run_id}, epoch {epoch} ({result.seconds:.1f}s)")
        for column in ("checkpoint", "parent", "pool version (lake / rebuilt)", "rows", "sha256", "result"):
            out.add_column(column)
        for c in result.checkpoints:
            out.add_row(f"{c.kind} v{c.version}" + (" (warm start)" if c.warm_start else ""), f"v{c.parent_version}",
                        f"{c.pool_version} / {c.rebuilt_pool_version}", str(c.rows), c.recorded_sha256[:12],
                        "[green]identical[/]" if c.matches else f"[red]{c.first_difference}[/]")
        console.print(out)
        if rescore:
            console.print(f"rescored {result.rescored_rollouts} rollouts: {len(result.changes)} values would change")
            if result.changes:
                changes = Table()
                for column in ("table", "row", "field", "recorded", "rescored"):
                    changes.add_column(column)
                for ch in result.changes:
                    changes.add_row(ch.table, ch.row_id, ch.field, str(ch.recorded), str(ch.rescored))
                console.print(changes)
        if result.scratch:
            console.print(f"rebuilt lake kept in {result.scratch}")
    if not result.ok:
        raise typer.Exit(1)


@contextlib.contextmanager
def _phases():
    """A progress bar per phase of the engine (generation, training, ingest), printed above the log lines."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        @contextlib.contextmanager
        def phase(description: str):
            task = bar.add_task(description, total=None)
            try:
                yield lambda done, total: bar.update(task, completed=done, total=total)
            finally:
                bar.remove_task(task)

        yield phase


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def _check_non_negative(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not value >= 0:  # `not >=` also refuses NaN
            raise UserError(f"--{name.replace('_', '-')} must be >= 0, got {value}")


def _check_port(port: int, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if not low <= port <= 65535:
        raise UserError(f"--port must be in {low}-65535{' (0: a free one)' if allow_zero else ''}, got {port}")


def _on_sigterm(signum, frame):  # a normal exit, so context managers stop the local broker
    raise SystemExit(128 + signum)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.ERROR)
    # The CLI shows its own progress: no per-file bars from transformers / huggingface_hub (read at their import,
    # so no need to import them here, which would slow every command's start).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    signal.signal(signal.SIGTERM, _on_sigterm)
    from deltalake.exceptions import DeltaError
    from kafka.errors import KafkaError

    try:
        app()
    except (UserError, LakeError, LeaseHeld, BrokerError, StorageError) as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(2)
    except (KafkaError, DeltaError) as exc:  # the broker or the storage failed mid-command
        if os.environ.get("GENENV_DEBUG"):
            raise
        where = "Kafka" if isinstance(exc, KafkaError) else "Delta Lake"
        first = str(exc).splitlines()[0] if str(exc) else ""
        err.print(f"[bold red]error:[/] {escape(f'{where}: {exc.__class__.__name__}: {first}')} "
                  "(GENENV_DEBUG=1 shows the traceback)", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
