"""A run's report folder: metrics.json, config.toml, PNG plots and report.md that shows them."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from ..coevolution import CurriculumConfig, EpochMetrics, RunConfig, to_toml  # noqa: E402


def plot_success(metrics: list[EpochMetrics], curriculum: CurriculumConfig, path) -> None:
    alpha, k = curriculum.alpha, curriculum.k
    fig, ax = plt.subplots(figsize=(6, 3.5))
    epochs = [m.epoch for m in metrics]
    ax.axhspan(alpha - k, alpha + k, color="tab:green", alpha=0.15, label=f"alpha band [{alpha - k:.2f}, {alpha + k:.2f}]")
    ax.axhline(alpha, color="tab:green", lw=1)
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


PLOTS = ("success", "validation", "difficulty")


def draw(name: str, metrics: list[EpochMetrics], curriculum, out) -> None:
    """One of the report's plots (PLOTS) to a path or a file object: the report folder and the web view draw the
    same pictures from the same recipe."""
    if name == "success":
        plot_success(metrics, curriculum, out)
    elif name == "validation":
        plot_series(metrics, {"validation accuracy": [m.validation_accuracy for m in metrics]}, "accuracy",
                    "Held-out validation accuracy", out)
    elif name == "difficulty":
        features = sorted({k for m in metrics for k in m.difficulty})
        plot_series(metrics, {k: [m.difficulty.get(k, float("nan")) for m in metrics] for k in features},
                    "mean value", "Difficulty features of valid tasks", out)
    else:
        raise ValueError(f"no plot {name!r}; plots: {', '.join(PLOTS)}")


def write_report(folder: Path, run_id: str, config: RunConfig, metrics: list[EpochMetrics], initial_accuracy: float,
                 lake_root: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"run_id": run_id, "initial_validation_accuracy": initial_accuracy,
                                                     "epochs": [m.__dict__ for m in metrics]}, indent=2))
    (folder / "config.toml").write_text(to_toml(config))
    for name in PLOTS:
        draw(name, metrics, config.curriculum, folder / f"{name}.png")
    rows = "\n".join(
        f"| {m.epoch} | {m.agent_version} | {m.env_version} | {m.tasks} | {m.valid_share:.2f} | {m.agent_success:.2f} | "
        f"{m.in_band_share:.2f} | {m.validation_accuracy:.3f} | {m.response_tokens:.1f} | "
        + ", ".join(f"{k}={v}" for k, v in m.difficulty.items()) + " |"
        for m in metrics)
    page = f"""# genenv run {run_id}

Domain **{config.domain}**, mode **{config.mode}**, agent `{config.agent_model}`, simulator `{config.env_model}`,
{config.epochs} epochs x {config.tasks_per_epoch} tasks x {config.group_size} rollouts. Lake: `{lake_root}`.
Validation accuracy before training: {initial_accuracy:.3f}.

| epoch | agent v | env v | tasks | valid | agent success | batches in band | validation acc | response tokens | difficulty |
|---|---|---|---|---|---|---|---|---|---|
{rows}

![success per epoch](success.png)
![validation accuracy](validation.png)
![difficulty features](difficulty.png)

Configuration: [config.toml](config.toml); per-epoch metrics: [metrics.json](metrics.json).
Audit any task with `genenv lake status --lake {lake_root}` and the tables under it.
"""
    path = folder / "report.md"
    path.write_text(page)
    return path
