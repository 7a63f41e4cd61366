"""The ablation (docs/DESIGN.md, "Modes and the ablation"): the four modes at equal agent-rollout budget, over seeds.

Every mode runs tasks_per_epoch x group_size rollouts per epoch for the same number of epochs, so the agent sees the
same number of rollouts; what differs is where its tasks come from. Every mode of a seed starts from that seed's warm
start (or every seed from the first seed's: `share_warm_start`). The table gives, per mode, the mean over seeds and a
95% bootstrap interval of each measure (MEASURES: validation, its gain, the in-band share over the last half of the
epochs, the simulator's selection bias and its trend, informative groups), and the paired differences against
genenv-random; the plot, validation accuracy, in-band share and selection bias per epoch per mode. Each run's
held-out answers before and after training go beside them (validation-<mode>-seed<seed>.jsonl), as a run's report
keeps them.

An ablation's runs keep every checkpoint (a run's epochs stay replayable), about 2.6 GB an epoch at the default: the
last powered one took 53 GB and filled its disk a minute after it ended (docs/RESULTS.md). So on a local lake, before
each run after the first, the ablation weighs what the last run wrote, times the runs still to come, against the
disk's free space, and stops there with one line if they cannot fit, rather than an hour later with a full disk. A
warm start's checkpoints are weighed apart: the runs that continue one write none (the first estimate, counting the
shared warm start in every run to come, stopped a 5-seed ablation that fitted).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path

from lake import Lake, LakeError, checkpoint_path
from lake.cache import size

from .config import MODES, RunConfig
from .stats import finite as _finite
from .stats import interval
from .sync import CoEvolution, EpochMetrics
from .writer import LakeWriter


def _as_measured(metrics: list[EpochMetrics], lake: Lake, run_id: str) -> list[EpochMetrics]:
    return metrics


def run_ablation(
    base: RunConfig,
    seeds: int,
    lake: Lake,
    servers: str,
    out: Path,
    say=print,
    modes: tuple[str, ...] = MODES,
    phase=None,
    measure: Callable[[list[EpochMetrics], Lake, str], list[EpochMetrics]] = _as_measured,
    jobs: int = 1,
    share_warm_start: bool = False,
) -> dict:
    """measure(metrics, lake, run_id): each run's metrics with the curriculum measures filled from the lake
    (engine.lineage.with_measures; passed in, as the lineage package depends on this one). With jobs > 1 the seeds
    run in that many processes side by side (`run_jobs`), and `lake` and `servers` only name where their lakes go.
    share_warm_start: every seed starts from the first seed's warm start and validation (a job's first, with jobs >
    1), so that an ablation pays one warm start and one validation before training, not one a seed; the seeds then
    vary only what comes after (the simulator's and the agent's sampling, the order of training)."""
    out.mkdir(parents=True, exist_ok=True)
    if jobs > 1:
        results = run_jobs(base, seeds, jobs, lake, out, say, modes, measure, share_warm_start)
    else:
        results = run_seeds(base, range(seeds), lake, servers, out, say, modes, phase, measure, share_warm_start)
    table = summarise(results)
    (out / "ablation.json").write_text(json.dumps(table, indent=2, allow_nan=False))
    (out / "ablation.md").write_text(markdown(table, base, seeds))
    plot(results, out / "ablation.png")
    return table


def run_seeds(
    base: RunConfig, seeds, lake: Lake, servers: str, out: Path, say, modes, phase, measure, share_warm_start=False
) -> dict:
    """Each seed's runs, one after the other, with runs.json in `out` rewritten after each run; before each run after
    the first, `check_room` (with --jobs, each job weighs its own runs)."""
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    start_from, initial = (0, 0), None
    runs_left = len(seeds) * (1 + sum(m != "genenv" for m in modes))
    warm_starts_left = 1 if share_warm_start else len(seeds)
    written = None  # the checkpoint bytes the last run wrote past its warm start (None before the first, and remote)
    warm_bytes = 0  # the checkpoint bytes of a warm start (its agent's and simulator's first versions)
    held = checkpoint_bytes(lake)  # what the checkpoint folders hold now: one walk of them a run, after it
    for seed in seeds:
        if not share_warm_start:
            start_from, initial = (0, 0), None
        for mode in ("genenv", *[m for m in modes if m != "genenv"]):
            # Every mode of a seed starts from the same warm-started models (the seed's first run's; with
            # share_warm_start the ablation's first run's), so the modes differ only in where the agent's tasks come
            # from.
            warm = base.warm_start and start_from == (0, 0)
            config = dataclasses.replace(base, mode=mode, seed=seed, run_id="", warm_start=warm)
            line = f"[ablation] {mode}, seed {seed}"
            if written is not None:
                needed = written * runs_left + warm_bytes * warm_starts_left
                free = check_room(lake, needed, written, runs_left)
                line += f" (the {runs_left} runs to come: about {needed / 1e9:.3g} GB of checkpoints, "
                line += f"{free / 1e9:.3g} GB free)"
            say(line)
            with LakeWriter(lake, servers) as writer:
                engine = CoEvolution(config, lake, writer, say=say, start_from=start_from, phase=phase)
                if initial is not None:  # the same models as the seed's first run: its validation holds
                    engine.initial_validation = initial
                metrics = measure(engine.run(), lake, engine.run_id)
            if warm or initial is None:
                start_from, initial = engine.warm_started, engine.initial_validation
            if held is not None:
                now = checkpoint_bytes(lake)
                if warm:  # the runs to come that do not warm-start write none of it
                    warm_bytes = sum(
                        size(lake.files.local(checkpoint_path(kind, version)))
                        for kind, version in zip(("agent", "env"), engine.warm_started, strict=True)
                    )
                written, held = now - held - (warm_bytes if warm else 0), now
            runs_left -= 1
            warm_starts_left -= warm
            if mode not in modes:
                continue
            results[mode].append(
                {
                    "run_id": engine.run_id,
                    "seed": seed,
                    "initial": engine.initial_accuracy,
                    "validation": [m.validation_accuracy for m in metrics],
                    "agent_success": [m.agent_success for m in metrics],
                    "in_band": [m.in_band_share for m in metrics],
                    "difficulty": [m.difficulty for m in metrics],
                    "selection_bias": [m.selection_bias for m in metrics],
                    "valid_share": [m.valid_share for m in metrics],
                    "chosen_levels": [m.chosen_levels for m in metrics],
                    "success_by_level": [m.success_by_level for m in metrics],
                    "informative": [m.informative_groups_per_100 for m in metrics],
                    "validation_by_level": [engine.initial_validation.by_level]
                    + [m.validation_by_level for m in metrics],
                    "bfcl": engine.final_benchmark.get("non_live_ast"),
                }
            )
            (out / "runs.json").write_text(json.dumps(results, indent=2))  # progress survives an interruption
            write_answers(out / f"validation-{mode}-seed{seed}.jsonl", engine.validation_answers())
    return results


def checkpoint_bytes(lake: Lake) -> int | None:
    """What a local lake's checkpoint folders hold on disk; None for a remote lake (its disk is not this machine's)."""
    if lake.files.remote:
        return None
    folder = lake.files.local("checkpoints")
    return size(folder) if folder.exists() else 0


def check_room(lake: Lake, needed: int, written: int, runs_left: int) -> int:
    """LakeError (one line) when the `needed` bytes of checkpoints that the `runs_left` runs still to come would write
    (each what the last run wrote past its warm start, `written`, and the warm starts still to come) would not fit in
    the free space of the local lake's disk; else that free space, in bytes."""
    free = shutil.disk_usage(lake.files.local("")).free
    if needed > free:
        raise LakeError(
            f"the ablation's {runs_left} runs still to come would write about {needed / 1e9:.1f} GB of checkpoints "
            f"(the last run wrote {written / 1e9:.1f} GB past its warm start) and the disk of {lake.root} has "
            f"{free / 1e9:.1f} GB free: "
            "stopped before it fills; give it a lake with room (--lake) or fewer --seeds (the runs done are in "
            "runs.json)"
        )
    return free


def write_answers(path: Path, answers: list[dict]) -> None:
    """A run's held-out answers before and after training, one item a line (CoEvolution.validation_answers): which
    items a mode's gain won and lost, and, beside another mode's file of the same seed, which items the two differ
    on. Nothing is written where the run has none."""
    if answers:
        path.write_text("".join(json.dumps(row) + "\n" for row in answers))


def run_jobs(
    base: RunConfig, seeds: int, jobs: int, lake: Lake, out: Path, say, modes, measure, share_warm_start=False
) -> dict:
    """The seeds dealt round-robin to `jobs` processes that run side by side, each with its own local broker and lake
    (<lake>/job<i>: a lake has one ingestor, and an ingestor takes every record of its broker's topics), its share
    of the cores as torch threads, and its runs.json in <out>/job<i>; their runs merged in seed order. On the
    project's 2-core machines two jobs of one thread are slower than one of two threads: the default's warm start
    took 333 and 346 s side by side against 194 s alone in the same hour (docs/RESULTS.md), so --jobs is for
    machines with cores to spare."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch threads or sockets forked
    threads = max(1, (os.cpu_count() or 1) // jobs)
    processes = []
    for job in range(min(jobs, seeds)):
        args = (base, list(range(job, seeds, jobs)), f"{lake.root}/job{job}", out / f"job{job}", modes, measure)
        process = context.Process(target=_job, args=(*args, threads, job, share_warm_start), name=f"job{job}")
        process.start()
        processes.append(process)
    for process in processes:
        process.join()
    failed = [f"{p.name} (exit {p.exitcode})" for p in processes if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"ablation {', '.join(failed)} failed; what each finished is in {out}/job<i>/runs.json")
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    for process in processes:
        for mode, runs in json.loads((out / process.name / "runs.json").read_text()).items():
            results[mode] += runs
    for runs in results.values():
        runs.sort(key=lambda r: r["seed"])
    for answers in out.glob("job*/validation-*.jsonl"):
        answers.replace(out / answers.name)
    (out / "runs.json").write_text(json.dumps(results, indent=2))
    say(f"[ablation] {seeds} seeds in {len(processes)} jobs: lakes {lake.root}/job<i>")
    return results


def _job(base, seeds, lake_root, out, modes, measure, threads, job, share_warm_start) -> None:
    """One process of `run_jobs`: its seeds through its own broker and lake."""
    import torch

    from streams import LocalBroker

    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    with LocalBroker() as broker:
        run_seeds(
            base,
            seeds,
            Lake(lake_root),
            broker.bootstrap,
            out,
            lambda text: print(f"[job {job}] {text}", flush=True),
            modes,
            None,
            measure,
            share_warm_start,
        )


def _slope(values: list[float]) -> float:
    """Least-squares change per epoch (NaN epochs left out; NaN with fewer than two)."""
    points = [(i, v) for i, v in enumerate(values) if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(points) < 2:
        return math.nan
    return statistics.linear_regression([float(i) for i, _ in points], [v for _, v in points]).slope


def _mean_or_nan(values) -> float:
    finite = _finite(values)
    return statistics.fmean(finite) if finite else math.nan


# What each run is measured by (one number per run): the targets of docs/DESIGN.md, "Modes and the ablation".
MEASURES: dict[str, Callable[[dict], float]] = {
    "final_validation": lambda r: r["validation"][-1],
    "validation_gain": lambda r: r["validation"][-1] - r["initial"],
    "in_band_last_half": lambda r: _mean_or_nan(r["in_band"][len(r["in_band"]) // 2 :]),
    "selection_bias": lambda r: _mean_or_nan(r["selection_bias"]),
    "selection_bias_per_epoch": lambda r: _slope(r["selection_bias"]),
    "informative_per_100": lambda r: _mean_or_nan(r["informative"]),
    "final_bfcl": lambda r: r.get("bfcl") if isinstance(r.get("bfcl"), (int, float)) else math.nan,  # final_bfcl_items
}
BASELINE = "genenv-random"  # what the paired differences are taken against


def summarise(results: dict[str, list[dict]]) -> dict:
    """Per mode, each measure's mean and bootstrap interval over seeds; per mode but the baseline, the same of the
    paired difference against the baseline's run of the same seed (seeds share their warm start, so pairing
    takes the seed's own luck out)."""
    per_run = {
        mode: {r["seed"]: {name: f(r) for name, f in MEASURES.items()} for r in runs} for mode, runs in results.items()
    }
    modes = {
        mode: {name: interval([m[name] for m in runs.values()]) for name in MEASURES} for mode, runs in per_run.items()
    }
    paired = {}
    if BASELINE in per_run:
        base = per_run[BASELINE]
        for mode, runs in per_run.items():
            if mode == BASELINE:
                continue
            seeds = sorted(set(runs) & set(base))
            paired[mode] = {
                name: interval([runs[s][name] - base[s][name] for s in seeds]) for name in MEASURES
            }  # NaN - x: left out
    return {"modes": modes, f"paired_vs_{BASELINE}": paired}


def cell(stats: dict, signed: bool = False) -> str:
    if stats["mean"] is None:
        return "-"
    sign = "+" if signed else ""
    return f"{stats['mean']:{sign}.3f} [{stats['low']:{sign}.3f}, {stats['high']:{sign}.3f}]"


def markdown(table: dict, base: RunConfig, seeds: int) -> str:
    names = list(MEASURES)
    header = "| mode | n | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names)
    rows = "\n".join(
        f"| {mode} | {next(iter(t.values()))['n']} | " + " | ".join(cell(t[n]) for n in names) + " |"
        for mode, t in table["modes"].items()
    )
    paired = table[f"paired_vs_{BASELINE}"]
    diffs = "\n".join(
        f"| {mode} - {BASELINE} | {t['final_validation']['n']} | " + " | ".join(cell(t[n], True) for n in names) + " |"
        for mode, t in paired.items()
    )
    return (
        f"# Ablation: {base.domain}, {seeds} seeds, {base.epochs} epochs x {base.tasks_per_epoch} tasks x "
        f"{base.group_size} rollouts, agent {base.agent_model}\n\n"
        "Each cell: the mean over seeds and its 95% bootstrap interval. final_validation and validation_gain: "
        f"held-out greedy accuracy ({base.validation_size} items) after the last epoch, and its change from before "
        "training; in_band_last_half: share of scored groups in the alpha band over the last half of the epochs; "
        "selection_bias: the level the simulator chose minus the mean level offered (selection_bias_per_epoch: "
        "its least-squares change per epoch); informative_per_100: groups with 0 < p_hat < 1 per 100 "
        "rollouts; final_bfcl: BFCL simple_python + multiple after the last epoch (with final_bfcl_items, "
        f"else -).\n\n{header}\n{rows}\n\nPaired differences against {BASELINE} (same seed, same warm start):"
        f"\n\n{header.replace('| mode |', '| modes |')}\n{diffs}\n\n![ablation](ablation.png)\n"
    )


def plot(results: dict[str, list[dict]], path: Path) -> None:
    """Per mode, the mean over seeds per epoch (band: +- one standard deviation) of validation accuracy (with
    the start at epoch -1), the in-band share and the selection bias."""
    panels = (
        ("validation accuracy", lambda r: [r["initial"]] + r["validation"], -1),
        ("groups in band", lambda r: r["in_band"], 0),
        ("selection bias (levels)", lambda r: r["selection_bias"], 0),
    )
    # A Figure without pyplot: no backend to choose, nothing global to close. Imported here, as only the ablation
    # draws and every worker process imports this package.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.6))
    axes = fig.subplots(1, 3)
    for ax, (title, series, first) in zip(axes, panels):
        for mode, runs in results.items():
            if not runs:
                continue
            curves = [series(r) for r in runs]
            columns = [_finite(c[i] for c in curves) for i in range(len(curves[0]))]
            means = [statistics.fmean(c) if c else math.nan for c in columns]
            sds = [statistics.stdev(c) if len(c) > 1 else 0.0 for c in columns]
            xs = list(range(first, first + len(means)))
            ax.plot(xs, means, "o-", label=mode)
            ax.fill_between(xs, [m - d for m, d in zip(means, sds)], [m + d for m, d in zip(means, sds)], alpha=0.15)
        ax.set(xlabel="epoch" + (" (-1: before training)" if first < 0 else ""), title=title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
