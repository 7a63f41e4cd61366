"""What the lake holds of one run: its tasks, their rollouts and rewards, and which tasks are scored.

Many readers ask this, some often: the async simulator every second while it waits for a round to be scored,
the rollout and reward workers on their polls, the launcher before it calls a run whole, and both resumes
(sync and async) to find where a run stopped. They all read it here, from lazy scans that keep only the run's
rows and the columns asked for: a run that streams for days has silver tables that no worker should read whole
once a second.

Invariants:
- a run's rows are its rounds' rows: the warm start's tasks and rollouts carry the run id but are not
  rounds of the run (`producer == "warm-start"`), so they are left out;
- each id counts once: the lake keeps the first copy of a repeated event, and these scans keep the first
  row of an id again, so a duplicate that landed before that rule cannot count twice;
- a task is scored when a BatchScored of the run names it (silver/batch `task_ids`).
"""

from __future__ import annotations

import json

import polars as pl

from .tables import Lake, silver


class RunRows:
    """One run's rows in a lake's silver tables, as lazy frames (nothing is read until collected)."""

    def __init__(self, lake: Lake, run_id: str):
        self.lake, self.run_id = lake, run_id

    def _scan(self, kind: str, where: pl.Expr | None = None) -> pl.LazyFrame:
        """The run's rows of a silver table that meet `where`: filters the scan, so only they are read."""
        of_run = (pl.col("run_id") == self.run_id) & (pl.col("producer") != "warm-start")
        return self.lake.scan(silver(kind)).filter(of_run if where is None else of_run & where)

    def _first_of_each(
        self, kind: str, key: str, columns: tuple[str, ...], where: pl.Expr | None = None
    ) -> pl.LazyFrame:
        """The first row of each `key` among the run's rows that meet `where`; all columns unless some are named
        (the key always comes with them)."""
        rows = self._scan(kind, where).unique(key, keep="first", maintain_order=True)
        return rows.select(key, *(c for c in columns if c != key)) if columns else rows

    def tasks(self, *columns: str, valid: bool = True) -> pl.LazyFrame:
        """The run's tasks, only the valid ones unless `valid=False`."""
        return self._first_of_each("task", "task_id", columns, pl.col("valid") if valid else None)

    def rollouts(self, *columns: str) -> pl.LazyFrame:
        return self._first_of_each("rollout", "rollout_id", columns)

    def rewards(self, *columns: str) -> pl.LazyFrame:
        return self._first_of_each("reward", "rollout_id", columns)

    def rollouts_per_task(self, task_ids: list[str] | None = None) -> pl.LazyFrame:
        """task_id, len: how many distinct rollouts the lake holds of each task (of `task_ids` only, if given).
        The rollout worker asks this on every poll, so the ids filter the scan itself and no row is kept
        beyond two id columns."""
        rows = self._scan("rollout", None if task_ids is None else pl.col("task_id").is_in(task_ids))
        return rows.group_by("task_id").agg(pl.col("rollout_id").n_unique().alias("len"))

    def scored_ids(self) -> pl.LazyFrame:
        """One column, task_id: every task a BatchScored of the run names."""
        return (
            self._first_of_each("batch", "batch_id", ("task_ids",))
            .select(pl.col("task_ids").explode().alias("task_id"))
            .unique()
        )

    def unscored_tasks(self, *columns: str) -> pl.LazyFrame:
        """The run's valid tasks that no BatchScored covers yet."""
        return self.tasks(*columns).join(self.scored_ids(), on="task_id", how="anti")

    def valid_per_epoch(self) -> dict[int, int]:
        """Valid tasks per epoch (round)."""
        return dict(self.tasks("epoch").group_by("epoch").len().collect().iter_rows())

    def scored_per_epoch(self) -> dict[int, int]:
        """Tasks scored per epoch (round), from the batches' sizes."""
        batches = self._first_of_each("batch", "batch_id", ("epoch", "n_tasks"))
        return dict(batches.group_by("epoch").agg(pl.col("n_tasks").sum()).collect().iter_rows())

    def outcomes(self) -> list[tuple[dict, bool]]:
        """(difficulty, success) of every scored rollout of the run's valid tasks, oldest first: the simulator's
        history of how its tasks went."""
        scored = (
            self.rewards("task_id", "success", "produced_at")
            .join(self.tasks("difficulty_json"), on="task_id")
            .sort("produced_at")
            .select("difficulty_json", "success")
            .collect()
        )
        return [(json.loads(d or "{}"), bool(ok)) for d, ok in scored.iter_rows()]
