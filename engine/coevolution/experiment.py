"""The ablation (docs/DESIGN.md, "Modes and the ablation"): the four modes at equal agent-rollout budget, over several seeds.

Every mode runs tasks_per_epoch x group_size rollouts per epoch for the same number of epochs, so
the agent sees the same number of rollouts; what differs is where its tasks come from. The table
gives the mean and standard deviation over seeds of the final validation accuracy (and its gain
over the same seed's accuracy before training); the plot, validation accuracy per epoch per mode.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lake import Lake  # noqa: E402

from .config import MODES, RunConfig  # noqa: E402
from .sync import CoEvolution  # noqa: E402
from .writer import LakeWriter  # noqa: E402


def run_ablation(base: RunConfig, seeds: int, lake: Lake, bootstrap: str, out: Path, say=print,
                 modes: tuple[str, ...] = MODES, phase=None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    for seed in range(seeds):
        start_from = (0, 0)
        for mode in ("genenv", *[m for m in modes if m != "genenv"]):
            # Every mode of a seed starts from the same warm-started models (the first run's), so the modes
            # differ only in where the agent's tasks come from.
            warm = base.warm_start and start_from == (0, 0)
            config = dataclasses.replace(base, mode=mode, seed=seed, run_id="", warm_start=warm)
            say(f"[ablation] {mode}, seed {seed}")
            with LakeWriter(lake, bootstrap) as writer:
                engine = CoEvolution(config, lake, writer, say=say, start_from=start_from, phase=phase)
                metrics = engine.run()
            if warm:
                start_from = engine.warm_started
            if mode not in modes:
                continue
            results[mode].append({
                "run_id": engine.run_id, "seed": seed, "initial": engine.initial_accuracy,
                "validation": [m.validation_accuracy for m in metrics],
                "agent_success": [m.agent_success for m in metrics], "in_band": [m.in_band_share for m in metrics],
                "difficulty": [m.difficulty for m in metrics],
            })
            (out / "runs.json").write_text(json.dumps(results, indent=2))  # progress survives an interruption
    table = summarise(results)
    (out / "ablation.json").write_text(json.dumps(table, indent=2))
    (out / "ablation.md").write_text(markdown(table, base, seeds))
    plot(results, out / "ablation.png")
    return table


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(results: dict[str, list[dict]]) -> dict:
    table = {}
    for mode, runs in results.items():
        final = [r["validation"][-1] for r in runs]
        gain = [r["validation"][-1] - r["initial"] for r in runs]
        band = [statistics.fmean(r["in_band"]) for r in runs]
        table[mode] = {"runs": len(runs), "final_validation": _mean_std(final), "gain": _mean_std(gain),
                       "in_band_share": _mean_std(band)}
    return table


def markdown(table: dict, base: RunConfig, seeds: int) -> str:
    rows = "\n".join(
        f"| {mode} | {t['runs']} | {t['final_validation'][0]:.3f} ± {t['final_validation'][1]:.3f} | "
        f"{t['gain'][0]:+.3f} ± {t['gain'][1]:.3f} | {t['in_band_share'][0]:.2f} |"
        for mode, t in table.items())
    return (f"# Ablation: {base.domain}, {seeds} seeds, {base.epochs} epochs x {base.tasks_per_epoch} tasks x "
            f"{base.group_size} rollouts, agent {base.agent_model}\n\n"
            "| mode | runs | final validation accuracy (mean ± sd) | gain over start | batches in band |\n"
            f"|---|---|---|---|---|\n{rows}\n\n![validation per epoch](ablation.png)\n")


def plot(results: dict[str, list[dict]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for mode, runs in results.items():
        if not runs:
            continue
        curves = [[r["initial"]] + r["validation"] for r in runs]
        means = [statistics.fmean(c[i] for c in curves) for i in range(len(curves[0]))]
        sds = [statistics.stdev(c[i] for c in curves) if len(curves) > 1 else 0.0 for i in range(len(curves[0]))]
        xs = list(range(-1, len(means) - 1))
        ax.plot(xs, means, "o-", label=mode)
        ax.fill_between(xs, [m - s for m, s in zip(means, sds)], [m + s for m, s in zip(means, sds)], alpha=0.15)
    ax.set(xlabel="epoch (-1: before training)", ylabel="validation accuracy", title="Ablation: validation accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
