"""Per-epoch metrics of a run, read back from the lake: the async mode's report, and the web view's run page.

A run's rows are a producer's text once they are in the lake, so every value read here is checked: what does
not read as the field it claims to be is left out, never an error.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, fields, replace

import polars as pl

from lake import CHECKPOINTS, Lake, read_table, silver

from ..coevolution import EpochMetrics
from ..coevolution.roles import AGENTS_OWN
from .fields import json_object, share_in_band
from .measures import CurriculumMeasures, curriculum_measures

MEASURES = [f.name for f in fields(CurriculumMeasures)]

FEATURE_NAME = re.compile(r"[A-Za-z0-9_ .-]{1,40}")
MAX_FEATURES = 12


def difficulty_means(difficulty_jsons: list[str | None]) -> dict[str, float]:
    """Mean of each numeric difficulty feature over the tasks that have it. A producer writes difficulty_json, so
    it may be anything: what is not a JSON object of finite numbers under plain names (they become plot labels)
    is left out, never an error; at most MAX_FEATURES features, by name."""
    values: dict[str, list[float]] = {}
    for raw in difficulty_jsons:
        for name, value in json_object(raw).items():
            if type(value) not in (int, float) or not FEATURE_NAME.fullmatch(name):
                continue
            try:
                number = float(value)
            except OverflowError:
                continue
            if math.isfinite(number):
                values.setdefault(name, []).append(number)
    return {name: round(statistics.fmean(values[name]), 3) for name in sorted(values)[:MAX_FEATURES]}


def levels_of(value) -> dict[str, float]:
    """A checkpoint's recorded validation per level (a producer's JSON: anything but level -> number reads as none)."""
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if type(v) in (int, float)}


def metrics_from_lake(lake: Lake, run_id: str) -> list[EpochMetrics]:
    """Per-epoch metrics of a run, computed from what the lake holds (the async mode's report)."""

    def of_run(table: str) -> pl.DataFrame:
        frame = read_table(lake, table)
        return frame.filter(pl.col("run_id") == run_id)

    not_warm_start = pl.col("producer") != "warm-start"
    tasks = of_run(silver("task")).filter(not_warm_start)
    rollouts = of_run(silver("rollout")).filter(AGENTS_OWN)
    rewards = of_run(silver("reward")).filter(AGENTS_OWN)
    batches = of_run(silver("batch")).filter(not_warm_start)
    checkpoints = of_run(CHECKPOINTS).sort("version")
    out = []
    for epoch in sorted(set(tasks["epoch"].to_list())):
        t = tasks.filter(pl.col("epoch") == epoch)
        valid = t.filter(pl.col("valid"))
        r = rewards.filter(pl.col("epoch") == epoch)
        b = batches.filter(pl.col("epoch") == epoch)
        ro = rollouts.filter(pl.col("epoch") == epoch)
        upto = checkpoints.filter(pl.col("epoch") <= epoch)
        agents = upto.filter(pl.col("model_kind") == "agent")
        envs = upto.filter(pl.col("model_kind") == "env")
        recorded = [
            json_object(m)
            for m in checkpoints.filter((pl.col("epoch") == epoch) & (pl.col("model_kind") == "agent"))["metrics_json"]
        ]
        recorded = [m for m in recorded if type(m.get("validation_accuracy")) in (int, float)]
        out.append(
            EpochMetrics(
                epoch=epoch,
                agent_version=int(agents["version"].max() or 0) if agents.height else 0,
                env_version=int(envs["version"].max() or 0) if envs.height else 0,
                tasks=t.height,
                valid_share=round(valid.height / max(t.height, 1), 3),
                agent_success=round(r["success"].mean() or 0.0, 3) if r.height else 0.0,
                batch_p_hats=[round(p, 3) for p in b["p_hat"].to_list()],
                in_band_share=round(share_in_band(b) or 0.0, 3),
                difficulty=difficulty_means(valid["difficulty_json"].to_list()),
                response_tokens=round(statistics.fmean(len(x) for x in ro["completion_token_ids"].to_list()), 2)
                if ro.height
                else 0.0,
                validation_accuracy=recorded[-1]["validation_accuracy"] if recorded else float("nan"),
                validation_by_level=levels_of(recorded[-1].get("validation_by_level")) if recorded else {},
                **asdict(curriculum_measures(t, r)),
            )
        )
    return out


def with_measures(metrics: list[EpochMetrics], lake: Lake, run_id: str) -> list[EpochMetrics]:
    """A sync run's in-memory metrics with the curriculum measures of each epoch from the lake's rows."""
    by_epoch = {m.epoch: m for m in metrics_from_lake(lake, run_id)}
    return [
        replace(m, **{name: getattr(by_epoch[m.epoch], name) for name in MEASURES}) if m.epoch in by_epoch else m
        for m in metrics
    ]
