"""What shows whether the curriculum bites, per epoch, computed from the lake's rows of that epoch.

    selection_bias           mean over valid tasks of (the level the simulator chose - the mean level it was
                             offered): what RWR on the alpha-curriculum reward should move (toolcall offers
                             levels; domains that offer none leave it NaN)
    chosen_levels            histogram of the chosen levels (valid tasks)
    offered_levels           histogram of the levels offered to those tasks' requests
    informative_groups_per_100
                             groups with 0 < p_hat < 1 (non-zero GRPO advantage) per 100 rollouts scored
    success_by_level         mean rollout success per level of the task (a calibration curve; over epochs a heat map)

"Level" is the domain's difficulty feature (toolcall: level; arith: digits; qa: tier), read from each task's
difficulty_json. Every value is a producer's text, so what does not read as a number is left out, never an error.
`genenv audit epoch`, the report, metrics.json and the web view all take these numbers from here.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import polars as pl

from ..coevolution.roles import level_name, offered_of
from ..domains import DOMAINS, get_domain
from .fields import json_object


@dataclass
class CurriculumMeasures:
    selection_bias: float = float("nan")
    chosen_levels: dict[str, int] = field(default_factory=dict)
    offered_levels: dict[str, int] = field(default_factory=dict)
    informative_groups_per_100: float = float("nan")
    success_by_level: dict[str, float] = field(default_factory=dict)


def task_level(row: dict) -> float | None:
    """The task's level by its domain's difficulty feature, or None."""
    if row["domain"] not in DOMAINS:
        return None
    value = json_object(row["difficulty_json"]).get(get_domain(row["domain"]).difficulty_feature)
    if type(value) not in (int, float) or not math.isfinite(value):
        return None
    return float(value)


def curriculum_measures(tasks: pl.DataFrame, rewards: pl.DataFrame) -> CurriculumMeasures:
    """The measures of one epoch: its generated tasks (silver/task rows) and their scored rollouts (silver/reward)."""
    out = CurriculumMeasures()
    levels: dict[str, float] = {}
    biases, chosen, offered = [], [], []
    for row in tasks.filter(pl.col("valid")).iter_rows(named=True):
        level = task_level(row)
        if level is None:
            continue
        levels[row["task_id"]] = level
        chosen.append(level)
        offers = offered_of(row.get("offered_json") or "[]")
        if offers:
            offered += offers
            biases.append(level - statistics.fmean(offers))
    out.chosen_levels = histogram(chosen)
    out.offered_levels = histogram(offered)
    if biases:
        out.selection_bias = round(statistics.fmean(biases), 4)
    if rewards.height:
        groups = rewards.group_by("task_id").agg(pl.len().alias("n"), pl.col("success").sum().alias("s"))
        informative = groups.filter((pl.col("s") > 0) & (pl.col("s") < pl.col("n"))).height
        out.informative_groups_per_100 = round(100 * informative / rewards.height, 4)
        by_level: dict[str, list[bool]] = {}
        for task_id, success in zip(rewards["task_id"].to_list(), rewards["success"].to_list()):
            if task_id in levels:
                by_level.setdefault(level_name(levels[task_id]), []).append(bool(success))
        out.success_by_level = {name: round(sum(v) / len(v), 4) for name, v in sorted(by_level.items(), key=by_number)}
    return out


def histogram(values: list[float]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in sorted(values):
        counts[level_name(value)] = counts.get(level_name(value), 0) + 1
    return counts


def by_number(item: tuple[str, object]) -> float:
    return float(item[0])
