"""The commands that read what a run left: audit (a task, a checkpoint, an epoch), replay, and the web view."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from lake import Lake

from .app import app, audit_app
from .options import JsonOpt, LakeOpt, RunOpt, UserError, check_port
from .render import console, phases, replay_tables, say, show


@audit_app.command("task")
def audit_task(
    task_id: Annotated[str, typer.Argument(help="A task id (see `genenv audit epoch`).")],
    lake: LakeOpt = "genenv-lake",
    as_json: JsonOpt = False,
) -> None:
    """The whole life of one task: prompt and generation, validation, rollouts with rewards, its batch's
    p_hat and R_env, the pool versions that hold it, the checkpoints trained on them."""
    from engine.lineage import audit_task as audit

    show(audit(Lake(lake, create=False), task_id), as_json, f"task {task_id}")


@audit_app.command("checkpoint")
def audit_checkpoint(
    kind: Annotated[str, typer.Argument(help="agent or env.")],
    version: Annotated[int, typer.Argument(help="Registered version.")],
    lake: LakeOpt = "genenv-lake",
    as_json: JsonOpt = False,
) -> None:
    """A checkpoint's parents back to the base model, the pool rows each update trained on, its metrics."""
    from engine.lineage import audit_checkpoint as audit

    show(audit(Lake(lake, create=False), kind, version), as_json, f"{kind} v{version}")


@audit_app.command("epoch")
def audit_epoch(
    epoch: Annotated[int, typer.Argument(help="Epoch number (0 includes the warm start).")],
    lake: LakeOpt = "genenv-lake",
    run: RunOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One epoch of a run: tasks, valid share, quarantine by reason, agent success, share in band, the curriculum's
    measures (selection bias, levels chosen and offered, informative groups per 100 rollouts, success per level),
    checkpoints, and the workers the supervisor restarted."""
    from engine.lineage import audit_epoch as audit

    answer = audit(Lake(lake, create=False), epoch, run)
    show(answer, as_json, f"run {answer['run_id']}, epoch {epoch}")


@app.command()
def replay(
    epoch: Annotated[int, typer.Option("--epoch", help="The epoch to replay (0 includes the warm start).")],
    lake: LakeOpt = "genenv-lake",
    run: RunOpt = None,
    rescore: Annotated[
        bool,
        typer.Option(
            "--rescore",
            help="Also re-run the domain checker and report the rewards, p_hat values and "
            "filter decisions that would change.",
        ),
    ] = False,
    scratch: Annotated[
        Path | None, typer.Option(help="Keep the rebuilt lake in this (new) folder (default: a temporary one).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay an epoch: rebuild it from the bronze log, retrain its checkpoints, check their sha256 (exit 1 if any
    differs).

    The run's bronze records are refined into a scratch lake up to what each update read; each checkpoint is
    retrained from its recorded parent with the config and seed in its genenv.json."""
    from engine.lineage import replay_epoch

    if scratch is not None and scratch.exists() and not scratch.is_dir():
        raise UserError(f"--scratch {scratch} is a file; name a new folder")
    lake_ = Lake(lake, create=False)
    with phases() as phase:
        result = replay_epoch(lake_, epoch, run, scratch, rescore, say=say, phase=phase)
    if as_json:
        print(json.dumps({**dataclasses.asdict(result), "ok": result.ok}, indent=2, default=str))
    else:
        for part in replay_tables(result, epoch, rescore):
            console.print(part)
    if not result.ok:
        raise typer.Exit(1)


@app.command()
def ui(
    lake: LakeOpt = "genenv-lake",
    host: Annotated[str, typer.Option(help="Address to listen on (keep 127.0.0.1 unless you mean to share it).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port.")] = 8765,
) -> None:
    """A read-only web view of the lake: runs, epochs with metrics and plots, a task browser with each task's
    lineage, the quarantine with reasons. Ctrl-C stops it."""
    from engine.lineage import serve

    check_port(port)
    lake_ = Lake(lake, create=False)
    console.print(f"genenv ui for {lake_.root} on [bold]http://{host}:{port}/[/] (read only; Ctrl-C stops it)")
    try:
        serve(lake_, host, port)
    except OSError as exc:  # the address is taken, or not this machine's
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
