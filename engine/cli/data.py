"""The data plane's commands: a local broker, the ingestor, and the lake's status, versions, pruning and vacuum."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from engine.supervised import supervisor_gone
from lake import (
    MIN_RETAIN_HOURS,
    RETAIN_HOURS,
    IngestConfig,
    Lake,
    check_lake_root,
    quarantine_by_reason,
    status,
    versions,
)
from lake import ingest as run_ingest
from streams import BOOTSTRAP_ENV, LocalBroker, ensure_topics, kafka_bootstrap

from .app import app, lake_app
from .options import BootstrapOpt, LakeOpt, UserError, check_non_negative, check_port, check_positive
from .render import console, table


@app.command()
def broker(port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0: a free one).")] = 0) -> None:
    """Run a local Kafka-compatible broker (Tansu) in the foreground and print its address."""
    check_port(port, allow_zero=True)
    with LocalBroker(port or None) as local:
        ensure_topics(local.bootstrap)
        console.print(
            f"broker listening on [bold]{local.bootstrap}[/] (export {BOOTSTRAP_ENV}={local.bootstrap}); "
            "Ctrl-C stops it"
        )
        print(local.bootstrap, flush=True)
        while local.running:
            time.sleep(0.5)


@app.command()
def ingest(
    lake: LakeOpt = "genenv-lake",
    bootstrap: BootstrapOpt = None,
    idle_exit: Annotated[
        float | None, typer.Option(help="Stop after this many idle seconds (default: forever).")
    ] = None,
    max_batch_records: Annotated[int, typer.Option(help="Records per micro-batch at most.")] = 20_000,
    max_batch_ms: Annotated[int, typer.Option(help="Milliseconds a micro-batch stays open at most.")] = 1_000,
    max_wait: Annotated[
        float, typer.Option(help="Seconds a rollout/reward waits for its task before quarantine.")
    ] = 30.0,
    partitions: Annotated[int, typer.Option(help="Partitions per topic when topics are created.")] = 3,
    lease_ttl: Annotated[
        float, typer.Option(help="Seconds after which a dead ingestor's lease lapses (it renews every third of that).")
    ] = 30.0,
    retain_hours: Annotated[
        float,
        typer.Option(
            help="Hourly, delete files that left the tables this long ago, but never those of a version a replay "
            "or a restart reads (0: never, else at least 1)."
        ),
    ] = RETAIN_HOURS,
) -> None:
    """Consume the genenv topics into the lake exactly once: bronze, validated silver, quarantine, gold pools.
    One ingestor per lake: a second one stops at start, naming the one that holds the lake's lease."""
    check_positive(
        max_batch_records=max_batch_records, max_batch_ms=max_batch_ms, partitions=partitions, lease_ttl=lease_ttl
    )
    check_non_negative(max_wait=max_wait, idle_exit=idle_exit)
    check_retention(retain_hours, allow_zero=True)
    check_lake_root(lake)
    config = IngestConfig(
        max_batch_records=max_batch_records,
        max_batch_ms=max_batch_ms,
        max_wait_s=max_wait,
        partitions=partitions,
        lease_ttl_s=lease_ttl,
        retain_hours=retain_hours,
    )
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
    apply: Annotated[
        bool, typer.Option("--apply", help="Delete the folders; without it, only say what would go.")
    ] = False,
) -> None:
    """Delete old checkpoint folders: keep the last N, every K-th, and each kept version's parent (a replay
    retrains from it); registry rows, and so every version's lineage, stay."""
    from trainers import KINDS
    from trainers.retention import apply_retention, plan_retention

    check_positive(keep_last=keep_last)
    check_non_negative(keep_every=keep_every)
    lake_ = Lake(lake, create=False)
    for kind in KINDS:
        plan = plan_retention(lake_, kind, keep_last, keep_every)
        gone = "deleted" if apply else "would be deleted"
        rows = [(str(v), "kept", why) for v, why in plan.keep.items()]
        rows += [(str(v), gone, "older than every reason to keep it") for v in plan.delete]
        title = f"{kind} checkpoints{'' if apply else ' (dry run: --apply deletes)'}"
        console.print(table(title, ("version", "folder", "why"), rows))
        if apply:
            apply_retention(lake_, plan)


@lake_app.command("vacuum")
def lake_vacuum(
    lake: LakeOpt = "genenv-lake",
    retain_hours: Annotated[
        float, typer.Option(help="Keep files that left the tables less than this long ago (at least 1).")
    ] = RETAIN_HOURS,
    apply: Annotated[
        bool, typer.Option("--apply", help="Delete the files; without it, only count what would go.")
    ] = False,
) -> None:
    """Delete the files no version still needed reads: older than --retain-hours, and read by no pool version a
    registered checkpoint trained on (so `genenv replay` and `genenv audit` keep working). The ingestor does the
    same hourly; run this on a lake no ingestor is writing."""
    from lake import DERIVED_TABLES, CommitRecord, bronze, vacuum
    from streams import ALL_TOPICS

    check_retention(retain_hours)
    lake_ = Lake(lake, create=False)
    tables = [bronze(topic) for topic in ALL_TOPICS] + list(DERIVED_TABLES)
    done = vacuum(lake_, tables, retain_hours, CommitRecord.read(lake_).versions, apply=apply)
    gone = "deleted" if apply else "would be deleted"
    rows = [(name, f"{files:,}") for name, files in done.items() if files]
    title = f"files {gone} (older than {retain_hours:g} h, read by no version a replay needs)"
    console.print(table(title, ("table", "files"), rows, numbers=1) if rows else f"no file to delete in {lake_.root}")


def check_retention(hours: float, allow_zero: bool = False) -> None:
    if not (hours >= MIN_RETAIN_HOURS or (allow_zero and hours == 0)) or hours == float("inf"):
        least = f"0 or at least {MIN_RETAIN_HOURS:g}" if allow_zero else f"at least {MIN_RETAIN_HOURS:g}"
        raise UserError(f"--retain-hours must be {least} (an update in flight reads a recent version), got {hours}")


@lake_app.command("status")
def lake_status(lake: LakeOpt = "genenv-lake") -> None:
    """Each table with its version and row count, and the quarantine by reason."""
    lake_ = Lake(lake, create=False)
    rows = [(row["table"], str(row["version"]), f"{row['rows']:,}") for row in status(lake_)]
    console.print(table(f"lake {lake_.root}", ("table", "version", "rows"), rows, numbers=2))
    reasons = quarantine_by_reason(lake_)
    if reasons:
        rows = [(reason, f"{count:,}") for reason, count in reasons.most_common()]
        console.print(table("quarantine by reason", ("reason", "rows"), rows, numbers=1))


@lake_app.command("versions")
def lake_versions(table_name: Annotated[str, typer.Argument(metavar="TABLE")], lake: LakeOpt = "genenv-lake") -> None:
    """The versions of one table with their commit metadata."""
    rows = [
        (str(v.version), v.timestamp.isoformat(timespec="seconds"), v.operation, str(v.metadata)[:120])
        for v in versions(Lake(lake, create=False), table_name)
    ]
    console.print(table(table_name, ("version", "time", "operation", "metadata"), rows))
