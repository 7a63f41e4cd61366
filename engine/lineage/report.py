"""A run's report folder: metrics.json, config.toml, PNG plots and report.md that shows them."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from ..coevolution import CurriculumConfig, EpochMetrics, RunConfig, to_toml, write_answers  # noqa: E402
from .fields import nan_to_none  # noqa: E402


def plot_success(metrics: list[EpochMetrics], curriculum: CurriculumConfig, path) -> None:
    alpha, k = curriculum.alpha, curriculum.k
    fig, ax = plt.subplots(figsize=(6, 3.5))
    epochs = [m.epoch for m in metrics]
    ax.axhspan(
        alpha - k, alpha + k, color="tab:green", alpha=0.15, label=f"alpha band [{alpha - k:.2f}, {alpha + k:.2f}]"
    )
    ax.axhline(alpha, color="tab:green", lw=1)
    if curriculum.lead:  # the simulator's reward peaks below the band it is measured by
        ax.axhline(
            alpha - curriculum.lead, color="tab:green", lw=1, ls="--", label=f"R_env peak {alpha - curriculum.lead:.2f}"
        )
    ax.plot(epochs, [m.agent_success for m in metrics], "o-", label="agent success on simulator tasks")
    for m in metrics:
        ax.scatter([m.epoch] * len(m.batch_p_hats), m.batch_p_hats, s=12, color="tab:gray", alpha=0.6)
    ax.set(xlabel="epoch", ylabel="success rate", ylim=(-0.05, 1.05), title="Success per epoch (dots: batch p_hat)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_series(metrics: list[EpochMetrics], series: dict[str, list[float]], ylabel: str, title: str, path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, values in series.items():
        ax.plot([m.epoch for m in metrics], values, "o-", label=name)
    ax.set(xlabel="epoch", ylabel=ylabel, title=title)
    if series:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def level_mean(histogram: dict[str, int]) -> float:
    total = sum(histogram.values())
    return sum(float(level) * n for level, n in histogram.items()) / total if total else float("nan")


def plot_selection(metrics: list[EpochMetrics], path) -> None:
    """The simulator's chosen level against the levels it was offered, and GRPO's informative groups."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    epochs = [m.epoch for m in metrics]
    ax.plot(epochs, [level_mean(m.chosen_levels) for m in metrics], "o-", label="mean level chosen")
    ax.plot(epochs, [level_mean(m.offered_levels) for m in metrics], "s--", label="mean level offered")
    ax.set(xlabel="epoch", ylabel="level", title="Selection: chosen vs offered (right: informative groups)")
    rate = ax.twinx()
    rate.plot(
        epochs,
        [m.informative_groups_per_100 for m in metrics],
        "^:",
        color="tab:gray",
        label="informative groups / 100 rollouts",
    )
    rate.set(ylabel="per 100 rollouts")
    lines = ax.get_legend_handles_labels()[0] + rate.get_legend_handles_labels()[0]
    ax.legend(lines, [line.get_label() for line in lines], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_calibration(metrics: list[EpochMetrics], path) -> None:
    """Success per level (rows) and epoch (columns), as a heat map; blank where an epoch had no task of a level."""
    levels = sorted({level for m in metrics for level in m.success_by_level}, key=float)
    grid = [[m.success_by_level.get(level, float("nan")) for m in metrics] for level in levels]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if levels:
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        fig.colorbar(image, ax=ax, label="success")
        ax.set_yticks(range(len(levels)), levels)
        ax.set_xticks(range(len(metrics)), [str(m.epoch) for m in metrics])
    ax.set(xlabel="epoch", ylabel="level", title="Agent success per level (calibration)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def validation_curves(metrics: list[EpochMetrics], initial_by_level: dict[str, float] | None) -> list[tuple[str, dict]]:
    """(label, level -> held-out success): before training (when known), then after each epoch that has one."""
    return ([("before training", initial_by_level)] if initial_by_level else []) + [
        (f"after epoch {m.epoch}", m.validation_by_level) for m in metrics if m.validation_by_level
    ]


def plot_levels(metrics: list[EpochMetrics], path, initial_by_level: dict[str, float] | None = None) -> None:
    """Held-out validation success per level: one curve before training (when known) and one after each epoch."""
    curves = validation_curves(metrics, initial_by_level)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, (label, by_level) in enumerate(curves):
        levels = sorted(by_level, key=float)
        ax.plot(
            [float(level) for level in levels],
            [by_level[level] for level in levels],
            "o-" if i == 0 else ".-",
            label=label,
            color="black" if label == "before training" else plt.cm.viridis(i / max(len(curves), 2)),
        )
    ax.set(xlabel="level", ylabel="validation success", ylim=(-0.05, 1.05), title="Held-out success per level")
    if curves:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PLOTS = ("success", "validation", "difficulty", "selection", "calibration", "levels")


def draw(
    name: str, metrics: list[EpochMetrics], curriculum, out, initial_by_level: dict[str, float] | None = None
) -> None:
    """One of the report's plots (PLOTS) to a path or a file object: the report folder and the web view draw the
    same pictures from the same recipe (the web view without the validation before training, which only the run
    that measured it knows)."""
    if name == "success":
        plot_success(metrics, curriculum, out)
    elif name == "validation":
        plot_series(
            metrics,
            {"validation accuracy": [m.validation_accuracy for m in metrics]},
            "accuracy",
            "Held-out validation accuracy",
            out,
        )
    elif name == "difficulty":
        features = sorted({k for m in metrics for k in m.difficulty})
        plot_series(
            metrics,
            {k: [m.difficulty.get(k, float("nan")) for m in metrics] for k in features},
            "mean value",
            "Difficulty features of valid tasks",
            out,
        )
    elif name == "selection":
        plot_selection(metrics, out)
    elif name == "calibration":
        plot_calibration(metrics, out)
    elif name == "levels":
        plot_levels(metrics, out, initial_by_level)
    else:
        raise ValueError(f"no plot {name!r}; plots: {', '.join(PLOTS)}")


def plot_learning(learning: dict, path) -> None:
    """Held-out validation against the agent's optimiser steps, each point with its items' 95% interval (the whole
    set before training and after the last epoch; the fixed subset between)."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for whole in (False, True):
        points = [
            p
            for p in learning.get("learning_curve", [])
            if (p["items"] == learning.get("validation_items")) == whole and p["low"] is not None
        ]
        if points:
            x, y = [p["agent_optimizer_steps"] for p in points], [p["accuracy"] for p in points]
            err = [[v - p["low"] for v, p in zip(y, points)], [p["high"] - v for v, p in zip(y, points)]]
            ax.errorbar(
                x,
                y,
                yerr=err,
                fmt="s" if whole else "o-",
                capsize=3,
                label=f"{'whole set' if whole else 'subset'} ({points[0]['items']} items)",
            )
    ax.set(
        xlabel="agent optimiser steps",
        ylabel="validation success",
        ylim=(-0.05, 1.05),
        title="Learning curve (bars: 95% bootstrap interval)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def learning_text(learning: dict | None) -> str:
    if not learning or learning.get("validation_gain") is None:
        return ""
    low, high = learning["validation_gain_interval"]
    return (
        f"Validation on the whole held-out set ({learning['validation_items']} items): "
        f"{learning['validation_before']:.3f} before training, {learning['validation_after']:.3f} after, gain "
        f"{learning['validation_gain']:+.3f} (paired 95% interval [{low:+.3f}, {high:+.3f}]) over "
        f"{learning['agent_optimizer_steps']} agent optimiser steps. Peak RSS {learning['peak_rss_gb']:.1f} GB.\n\n"
        "![learning](learning.png)\n\n"
    )


def benchmark_text(final: dict | None) -> str:
    if not final:
        return ""
    scores = ", ".join(f"{k} {v:.3f}" for k, v in final.items() if isinstance(v, float))
    return (
        f"BFCL after training ({final['model_version']}, the first {final['items'] // len(final['categories'])} "
        f"items of {' and '.join(final['categories'])}, eval id {final['eval_id']} in eval/results): {scores}.\n\n"
    )


def histogram_text(histogram: dict[str, int]) -> str:
    return ", ".join(f"{level}: {n}" for level, n in histogram.items()) or "-"


def write_report(
    folder: Path,
    run_id: str,
    config: RunConfig,
    metrics: list[EpochMetrics],
    initial_accuracy: float,
    lake_root: str,
    initial_by_level: dict[str, float] | None = None,
    final_benchmark: dict | None = None,
    learning: dict | None = None,
    validation_answers: list[dict] | None = None,
) -> Path:
    """learning: what the run taught (CoEvolution.learning: optimiser steps, the paired gain, the learning curve,
    each phase's time and peak RSS), at the top level of metrics.json and drawn in learning.png. validation_answers:
    the held-out set's answers before and after training, item by item (CoEvolution.validation_answers), one JSON
    line each in validation.jsonl: which items the gain won and lost, and how."""
    folder.mkdir(parents=True, exist_ok=True)
    # What `dtype = "auto"` and `device = "auto"` were on this machine: bf16 where the CPU multiplies it in hardware,
    # else fp32, whose run takes about 1.45 times as long (docs/RESULTS.md); config.toml keeps what was asked.
    precision = config.precision.resolved()
    (folder / "metrics.json").write_text(
        json.dumps(
            nan_to_none(
                {
                    "run_id": run_id,
                    "precision": {"device": precision.device, "dtype": precision.dtype},
                    "initial_validation_accuracy": initial_accuracy,
                    **(learning or {}),
                    "initial_validation_by_level": initial_by_level or {},
                    "final_benchmark": final_benchmark or {},
                    "epochs": [m.__dict__ for m in metrics],
                }
            ),
            indent=2,
            allow_nan=False,
        )
    )
    (folder / "config.toml").write_text(to_toml(config))
    if validation_answers:
        write_answers(folder / "validation.jsonl", validation_answers)
    for name in PLOTS:
        draw(name, metrics, config.curriculum, folder / f"{name}.png", initial_by_level)
    if learning and learning.get("learning_curve"):
        plot_learning(learning, folder / "learning.png")
    curves = validation_curves(metrics, initial_by_level)
    validation_levels = sorted({level for _, by_level in curves for level in by_level}, key=float)
    validation_rows = "\n".join(
        f"| {label} | "
        + " | ".join(f"{by_level[level]:.2f}" if level in by_level else "" for level in validation_levels)
        + " |"
        for label, by_level in curves
    )
    rows = "\n".join(
        f"| {m.epoch} | {m.agent_version} | {m.env_version} | {m.tasks} | {m.valid_share:.2f} | "
        f"{m.agent_success:.2f} | "
        f"{m.in_band_share:.2f} | {m.validation_accuracy:.3f} | {m.response_tokens:.1f} | "
        + ", ".join(f"{k}={v}" for k, v in m.difficulty.items())
        + f" | {m.selection_bias:+.2f} | "
        f"{m.informative_groups_per_100:.1f} |"
        for m in metrics
    )
    levels = sorted({level for m in metrics for level in m.success_by_level}, key=float)
    calibration = "\n".join(
        f"| {m.epoch} | "
        + " | ".join(f"{m.success_by_level[level]:.2f}" if level in m.success_by_level else "" for level in levels)
        + " |"
        for m in metrics
    )
    choices = "\n".join(
        f"| {m.epoch} | {histogram_text(m.chosen_levels)} | {histogram_text(m.offered_levels)} |" for m in metrics
    )
    answers_link = (
        "; the held-out answers before and after training, item by item: [validation.jsonl](validation.jsonl)"
        if validation_answers
        else ""
    )
    page = f"""# genenv run {run_id}

Domain **{config.domain}**, mode **{config.mode}**, agent `{config.agent_model}`, simulator `{config.env_model}`,
{config.epochs} epochs x {config.tasks_per_epoch} tasks x {config.group_size} rollouts, {precision.dtype} on
{precision.device}. Lake: `{lake_root}`.
Validation accuracy before training: {initial_accuracy:.3f}.

| epoch | agent v | env v | tasks | valid | agent success | batches in band | validation acc | response tokens | difficulty | selection bias | informative groups / 100 rollouts |
|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

Selection bias: the level the simulator chose minus the mean level it was offered (NaN where the domain offers no
choice); RWR on the curriculum reward should move it. Informative groups: groups with 0 < p_hat < 1, whose
rollouts get a non-zero GRPO advantage.

Success per level (rows: epochs; columns: levels):

| epoch | {" | ".join(levels)} |
|---|{"---|" * len(levels)}
{calibration}

Held-out validation success per level (greedy; rows: before training, on all {config.validation_size} items, and
after each epoch, on the fixed subset of {config.validation_subset or config.validation_size} except after the last;
columns: levels):

| when | {" | ".join(validation_levels)} |
|---|{"---|" * len(validation_levels)}
{validation_rows}

{learning_text(learning)}{benchmark_text(final_benchmark)}Levels chosen and offered (level: count):

| epoch | chosen | offered |
|---|---|---|
{choices}

![success per epoch](success.png)
![validation accuracy](validation.png)
![difficulty features](difficulty.png)
![levels chosen and offered](selection.png)
![success per level](calibration.png)
![held-out success per level](levels.png)

Configuration: [config.toml](config.toml); per-epoch metrics: [metrics.json](metrics.json){answers_link}.
Audit any task with `genenv lake status --lake {lake_root}` and the tables under it.
"""
    path = folder / "report.md"
    path.write_text(page)
    return path
