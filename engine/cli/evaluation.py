"""`genenv eval`: a model or checkpoint on the GenEnv paper's benchmarks, offline (engine/benchmarks/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lake import Lake, check_lake_root

from .app import app
from .options import LakeOpt, UserError, bad_input, check_positive
from .render import console, phases, table


@app.command("eval")
def eval_(
    benchmark: Annotated[str, typer.Option(help="bfcl, api-bank, bamboogle, alfworld, travelplanner or all.")],
    model: Annotated[
        str,
        typer.Option(
            help="A built-in model name, folder, GGUF file or hub id, or a registered checkpoint: "
            "agent:vN, agent:latest."
        ),
    ],
    limit: Annotated[
        int | None,
        typer.Option(help="Items per benchmark at most (BFCL: per category; ALFWorld: games, every task type)."),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            help="Folder holding api-bank/, bamboogle/, alfworld/, travelplanner/ (default: the "
            "repository's data/; BFCL's data comes with bfcl-eval)."
        ),
    ] = None,
    lake: LakeOpt = "genenv-lake",
    batch_size: Annotated[int, typer.Option(help="Prompts generated at once.")] = 16,
    bfcl_reading: Annotated[
        str,
        typer.Option(
            "--bfcl-reading",
            help="How BFCL answers are read: bfcl (bfcl-eval's default decoder, as the "
            "leaderboard scores) or lenient (also ```python fences and one call per line).",
        ),
    ] = "bfcl",
) -> None:
    """Evaluate a model or checkpoint offline on the GenEnv paper's benchmarks; results go to the lake's
    eval/results and eval/items tables and to a table here (with the paper's 7B figures beside the headline)."""
    from engine.benchmarks import BENCHMARKS, PAPER, benchmark_names, evaluate, model_agent, record

    if limit is not None:
        check_positive(limit=limit)
    check_positive(batch_size=batch_size)
    if data is not None and not data.is_dir():
        raise UserError(f"--data {data} is not a folder")
    check_lake_root(lake)
    loaded = {}  # every benchmark's data is read before any model is loaded: a missing file stops here
    with bad_input():
        for name in benchmark_names(benchmark):
            bench = BENCHMARKS[name](reading=bfcl_reading) if name == "bfcl" else BENCHMARKS[name]()
            loaded[name] = (bench, bench.load(data, limit))
    lake_ = Lake(lake)
    agent = model_agent(model, lake_, batch_size)
    rows = []
    with phases() as phase:
        for name, (bench, items) in loaded.items():
            with phase(f"{name}: {len(items)} items") as tick:
                report = evaluate(name, agent, model, data, limit, tick, bench, items)
            record(lake_, report)
            for metric, value in report.metrics.items():
                paper = f"{PAPER[name]}" if metric == bench.headline else ""
                shown = f"{100 * value:.1f}" if isinstance(value, float) and metric != "items" else str(value)
                rows.append((name, metric, shown, paper))
            console.print(f"{name}: {len(items)} items in {report.seconds:.0f}s; scoring: {report.scoring}")
    console.print(table(f"eval of {agent.version}", ("benchmark", "metric", "value", "paper (GenEnv 7B)"), rows))
    console.print(f"results: {lake_.root}/eval/results and eval/items (eval ids by benchmark in the table's eval_id)")
