"""What the lake holds of one run: its tasks, their rollouts and rewards, and which tasks are scored.

Four readers ask this, each often: the async simulator every second while it waits for a round to be scored,
the launcher before it calls a run whole, and both resumes (sync and async) to find where a run stopped.
They all read it here, from lazy scans that keep only the run's rows and the columns asked for: a run that
streams for days has silver tables that no worker should read whole once a second.

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

    def _of_run(self, kind: str, *columns: str) -> pl.LazyFrame:
        rows = self.lake.scan(silver(kind)).filter((pl.col("run_id") == self.run_id) & (pl.col("producer") != "warm-start"))
        return rows.select(*columns) if columns else rows

    def tasks(self, *columns: str, valid: bool = True) -> pl.LazyFrame:
        """The run's tasks (only the valid ones unless `valid=False`), the first copy of each; all columns
        unless some are named (task_id always comes with them)."""
        rows = self._of_run("task")
        if valid:
            rows = rows.filter(pl.col("valid"))
        rows = rows.unique("task_id", keep="first", maintain_order=True)
        return rows.select("task_id", *(c for c in columns if c != "task_id")) if columns else rows

    def rollouts(self, *columns: str) -> pl.LazyFrame:
        return self._of_run("rollout", *_with("rollout_id", columns)).unique("rollout_id", keep="first", maintain_order=True)

    def rewards(self, *columns: str) -> pl.LazyFrame:
        return self._of_run("reward", *_with("rollout_id", columns)).unique("rollout_id", keep="first", maintain_order=True)

    def scored_ids(self) -> pl.LazyFrame:
        """One column, task_id: every task a BatchScored of the run names."""
        return self._of_run("batch", "task_ids").explode("task_ids").select(pl.col("task_ids").alias("task_id")).unique()

    def unscored_tasks(self, *columns: str) -> pl.LazyFrame:
        """The run's valid tasks that no BatchScored covers yet."""
        return self.tasks(*columns).join(self.scored_ids(), on="task_id", how="anti")

    def valid_per_epoch(self) -> dict[int, int]:
        """Valid tasks per epoch (round)."""
        return dict(self.tasks("epoch").group_by("epoch").len().collect().iter_rows())

    def scored_per_epoch(self) -> dict[int, int]:
        """Tasks scored per epoch (round), from the batches' sizes."""
        batches = self._of_run("batch", "batch_id", "epoch", "n_tasks").unique("batch_id", keep="first")
        return dict(batches.group_by("epoch").agg(pl.col("n_tasks").sum()).collect().iter_rows())

    def outcomes(self) -> list[tuple[dict, bool]]:
        """(difficulty, success) of every scored rollout of the run's valid tasks, oldest first: the simulator's
        history of how its tasks went."""
        scored = (self.rewards("task_id", "success", "produced_at")
                  .join(self.tasks("difficulty_json"), on="task_id").sort("produced_at")
                  .select("difficulty_json", "success").collect())
        return [(json.loads(d or "{}"), bool(ok)) for d, ok in scored.iter_rows()]


def _with(key: str, columns: tuple[str, ...]) -> tuple[str, ...]:
    """The columns asked for with the id first (none asked: all of them)."""
    return (key, *(c for c in columns if c != key)) if columns else ()
