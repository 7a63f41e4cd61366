"""The `genenv` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from lake import IngestConfig, Ingestor, Lake, LakeError, quarantine_by_reason, status, versions
from lake import ingest as run_ingest
from streams import BOOTSTRAP_ENV, BrokerError, LocalBroker, ensure_topics, kafka_bootstrap

app = typer.Typer(help="GenEnv: co-evolving agents and environment simulators, as an event-sourced curriculum engine.",
                  no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_enable=False)
lake_app = typer.Typer(help="Inspect the Delta lake: tables, versions, quarantine.", no_args_is_help=True)
app.add_typer(lake_app, name="lake")
console = Console()
err = Console(stderr=True, soft_wrap=True)

LakeOpt = Annotated[Path, typer.Option("--lake", help="Lake root directory.")]
BootstrapOpt = Annotated[Optional[str], typer.Option(
    "--bootstrap", help=f"Kafka bootstrap servers; default ${BOOTSTRAP_ENV}, else a local broker for the run.")]


class UserError(Exception):
    """A bad flag, path or config: reported as one line, exit code 2."""


@app.command()
def broker(port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0: a free one).")] = 0) -> None:
    """Run a local Kafka-compatible broker (Tansu) in the foreground and print its address."""
    with LocalBroker(port or None) as local:
        ensure_topics(local.bootstrap)
        console.print(f"broker listening on [bold]{local.bootstrap}[/] (export {BOOTSTRAP_ENV}={local.bootstrap}); Ctrl-C stops it")
        print(local.bootstrap, flush=True)
        while local.running:
            time.sleep(0.5)


@app.command()
def ingest(
    lake: LakeOpt = Path("genenv-lake"),
    bootstrap: BootstrapOpt = None,
    idle_exit: Annotated[Optional[float], typer.Option(help="Stop after this many idle seconds (default: run forever).")] = None,
    max_batch_records: Annotated[int, typer.Option(help="Records per micro-batch at most.")] = 20_000,
    max_batch_ms: Annotated[int, typer.Option(help="Milliseconds a micro-batch stays open at most.")] = 1_000,
    max_wait: Annotated[float, typer.Option(help="Seconds a rollout/reward waits for its task before quarantine.")] = 30.0,
    partitions: Annotated[int, typer.Option(help="Partitions per topic when topics are created.")] = 3,
) -> None:
    """Consume the genenv topics into the lake exactly once: bronze, validated silver, quarantine, gold pools."""
    config = IngestConfig(max_batch_records=max_batch_records, max_batch_ms=max_batch_ms, max_wait_s=max_wait,
                          partitions=partitions)
    _check_positive(max_batch_records=max_batch_records, max_batch_ms=max_batch_ms, partitions=partitions)
    lake_ = Lake(lake)
    with kafka_bootstrap(bootstrap) as servers, console.status("ingesting") as spinner:
        def progress(stats):
            spinner.update(f"ingested {stats.records:,} records in {stats.steps} steps")

        stats = run_ingest(lake_, servers, config, idle_exit_s=idle_exit, on_step=progress)
    console.print(stats.summary())


@lake_app.command("status")
def lake_status(lake: LakeOpt = Path("genenv-lake")) -> None:
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
def lake_versions(table: str, lake: LakeOpt = Path("genenv-lake")) -> None:
    """The versions of one table with their commit metadata."""
    out = Table(title=table)
    for column in ("version", "time", "operation", "metadata"):
        out.add_column(column)
    for v in versions(Lake(lake, create=False), table):
        out.add_row(str(v.version), v.timestamp.isoformat(timespec="seconds"), v.operation, str(v.metadata)[:120])
    console.print(out)


@app.command()
def run(
    lake: LakeOpt = Path("genenv-lake"),
    bootstrap: BootstrapOpt = None,
    epochs: Annotated[int, typer.Option(help="Epochs of events to publish.")] = 3,
    tasks: Annotated[int, typer.Option(help="Tasks per epoch.")] = 64,
    group: Annotated[int, typer.Option(help="Rollouts per task (G).")] = 8,
    run_id: Annotated[str, typer.Option(help="Run id stamped on every event.")] = "demo",
) -> None:
    """The main job. For now the data-plane demo: publish synthetic epochs through Kafka and ingest them."""
    from engine.demo import epoch_events, publish
    from lake import read_pool

    _check_positive(epochs=epochs, tasks=tasks, group=group)
    lake_ = Lake(lake)
    with kafka_bootstrap(bootstrap) as servers:
        ensure_topics(servers)
        ingestor = Ingestor(lake_, servers).start()
        try:
            for epoch in range(epochs):
                sent = publish(servers, epoch_events(run_id, epoch, tasks=tasks, group=group))
                target = ingestor.stats.records + sent
                with console.status(f"epoch {epoch}: ingesting {sent} events"):
                    ingestor.run(stop=lambda: ingestor.stats.records >= target)
                console.print(f"epoch {epoch}: {sent} events published and ingested")
        finally:
            ingestor.close()
    lake_status(lake)
    console.print(f"d_train: {read_pool(lake_, 'd_train').height:,} rows; d_env: {read_pool(lake_, 'd_env').height:,} rows")


@app.command()
def train(
    kind: Annotated[str, typer.Argument(help="agent (GRPO on gold/d_train) or env (RWR on gold/d_env).")],
    lake: LakeOpt = Path("genenv-lake"),
    pool_version: Annotated[Optional[int], typer.Option(help="Delta version of the pool to train on (default: the latest).")] = None,
    parent: Annotated[Optional[int], typer.Option(help="Checkpoint version to start from (default: the newest; 0: the base model).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Base model when no checkpoint exists yet (a built-in name, path or hub id).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="A trainer option as name=value (TRL names: learning_rate, beta, epsilon, loss_type, ...); repeatable.")] = [],
    run_id: Annotated[str, typer.Option(help="Run id stamped on the CheckpointPublished event.")] = "manual",
    epoch: Annotated[int, typer.Option(help="Epoch stamped on the event.")] = 0,
    bootstrap: BootstrapOpt = None,
) -> None:
    """One update: train the agent or the simulator on its pool, write a checkpoint, publish and register it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from engine.overrides import OverrideError, apply_overrides
    from engine.publishing import publish_checkpoint
    from trainers import KINDS, CheckpointError, ModelNotFound, TrainError, default_config, train_update

    if kind not in KINDS:
        raise UserError(f"unknown model kind {kind!r}; kinds: {', '.join(KINDS)}")
    try:
        config = apply_overrides(default_config(kind), set_)
    except OverrideError as exc:
        raise UserError(str(exc)) from None
    lake_ = Lake(lake, create=False)
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(f"training {kind}", total=None)
        try:
            record = train_update(kind, lake_, config, base_model=model, pool_version=pool_version, parent_version=parent,
                                  progress=lambda done, total: bar.update(task, completed=done, total=total))
        except (TrainError, CheckpointError, ModelNotFound) as exc:
            raise UserError(str(exc)) from None
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


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def _on_sigterm(signum, frame):  # a normal exit, so context managers stop the local broker
    raise SystemExit(128 + signum)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.ERROR)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        app()
    except (UserError, LakeError, BrokerError) as exc:
        err.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
