"""What commands print: rich tables, JSON answers and progress bars, apart from what the commands do.

Each `*_table` takes what an engine function returned and gives a rich Table; `show` prints an audit-style answer
as JSON or as a two-column table. Commands print with `console` (stdout), the engine's progress lines with `say`,
and report errors on `err` (stderr).
"""

from __future__ import annotations

import contextlib
import json
import time

from rich.console import Console
from rich.table import Table

console = Console()
err = Console(stderr=True, soft_wrap=True)


def say(line: str) -> None:
    """A progress line from the engine, printed as written: its text is not rich markup (an ablation's
    "[ablation] genenv, seed 0" printed as " genenv, seed 0")."""
    console.print(line, markup=False)


def table(title: str, columns: list[str] | tuple[str, ...], rows, numbers: int = 0, **options) -> Table:
    """A table of string cells; its last `numbers` columns hold figures, right-justified."""
    out = Table(title=title, **options)
    for i, column in enumerate(columns):
        out.add_column(column, justify="right" if i >= len(columns) - numbers else "left")
    for row in rows:
        out.add_row(*row)
    return out


def show(answer: dict, as_json: bool, title: str) -> None:
    """An answer as JSON, or as a two-column table whose nested values are printed as compact JSON."""
    if as_json:
        print(json.dumps(answer, indent=2, default=str))
        return
    rows = []
    for name, value in answer.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            value = "\n".join(json.dumps(item, default=str) for item in value)
        elif isinstance(value, (dict, list)):
            value = json.dumps(value, default=str)
        rows.append((name, str(value)))
    out = Table(title=title, show_lines=True)
    out.add_column("field", style="bold")
    out.add_column("value", overflow="fold")
    for row in rows:
        out.add_row(*row)
    console.print(out)


def run_summary(run_id: str, metrics) -> Table:
    """A run's epochs: versions, valid share, the agent's success, the share in band, validation accuracy."""
    rows = [
        (
            str(m.epoch),
            str(m.agent_version),
            str(m.env_version),
            f"{m.valid_share:.2f}",
            f"{m.agent_success:.2f}",
            f"{m.in_band_share:.2f}",
            f"{m.validation_accuracy:.3f}",
        )
        for m in metrics
    ]
    columns = ("epoch", "agent v", "env v", "valid", "agent success", "in band", "validation acc")
    return table(f"run {run_id}", columns, rows, numbers=len(columns))


def record_table(record) -> Table:
    """A checkpoint an update wrote: its lineage fields, then its trainer's metrics."""
    fields = ("parent_version", "base_model", "pool_table", "pool_version", "seed", "config_hash", "sha256", "path")
    rows = [(name, str(getattr(record, name))) for name in fields]
    rows += [
        (name, f"{value:.4g}" if isinstance(value, float) else str(value)) for name, value in record.metrics.items()
    ]
    return table(f"{record.model_kind} v{record.version}", ("field", "value"), rows)


def replay_tables(result, epoch: int, rescore: bool) -> list[Table | str]:
    """A replay's checkpoints (identical, or the first difference), and with --rescore the values that would change."""
    rows = [
        (
            f"{c.kind} v{c.version}" + (" (warm start)" if c.warm_start else ""),
            f"v{c.parent_version}",
            f"{c.pool_version} / {c.rebuilt_pool_version}",
            str(c.rows),
            c.recorded_sha256[:12],
            "[green]identical[/]" if c.matches else f"[red]{c.first_difference}[/]",
        )
        for c in result.checkpoints
    ]
    columns = ("checkpoint", "parent", "pool version (lake / rebuilt)", "rows", "sha256", "result")
    out: list[Table | str] = [
        table(f"replay of run {result.run_id}, epoch {epoch} ({result.seconds:.1f}s)", columns, rows)
    ]
    if rescore:
        out.append(f"rescored {result.rescored_rollouts} rollouts: {len(result.changes)} values would change")
        if result.changes:
            changes = [(ch.table, ch.row_id, ch.field, str(ch.recorded), str(ch.rescored)) for ch in result.changes]
            out.append(table("", ("table", "row", "field", "recorded", "rescored"), changes))
    if result.scratch:
        out.append(f"rebuilt lake kept in {result.scratch}")
    return out


@contextlib.contextmanager
def phases():
    """A progress bar per phase of the engine (generation, training, ingest), printed above the log lines:
    `with phases() as phase, phase("training") as tick: tick(done, total)`. Where stdout is not a terminal (a log
    file), rich draws no bar, so each phase prints one line when it ends instead: its work done and its time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:

        @contextlib.contextmanager
        def phase(description: str):
            task, start = bar.add_task(description, total=None), time.monotonic()
            try:
                yield lambda done, total: bar.update(task, completed=done, total=total)
            finally:
                if not console.is_terminal:
                    work = bar.tasks[bar.task_ids.index(task)]
                    amount = f" {work.completed:.0f}/{work.total:.0f}" if work.total else " done"
                    console.print(f"{description}:{amount} in {time.monotonic() - start:.1f} s", highlight=False)
                bar.remove_task(task)

        yield phase
