"""The alpha-curriculum: how the simulator is rewarded for tasks the agent solves about alpha of the time.

For a group of rollouts with empirical success rate p_hat (the granularity says which rollouts are a group:
one batch of tasks, as in the paper; one task's G rollouts; or the tasks of one difficulty level in one epoch,
since the level is what the simulator chooses, and with few tasks an epoch a task's G rollouts are mostly all
right or all wrong at any level, so that only a level's pooled success can sit in the band):

    R_env(p_hat) = exp(-beta * (p_hat - alpha + lead)^2)  highest (1) at p_hat = alpha - lead
    filtered     = |p_hat - alpha| > k                 left out of the simulator's update
    weight       = exp(R_env / T)                      the RWR weight before normalisation

The paper uses alpha = 0.5, k = 0.1 and no lead. The lead aims the reward below the band, which is still
measured around alpha: the agent's update after an epoch trains exactly its mixed groups, so a level in the band
in epoch e has risen by epoch e + 1 (docs/RESULTS.md), and a simulator rewarded at alpha chases a band the agent
has already left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

GRANULARITIES = ("batch", "task", "level")


@dataclass
class CurriculumConfig:
    alpha: float = 0.5  # the target success rate
    beta: float = 10.0  # sharpness of R_env around alpha
    k: float = 0.1  # half-width of the band kept for the simulator's update
    lead: float = 0.0  # R_env peaks at alpha - lead: where a task should be before the agent's update raises it
    granularity: Literal["batch", "task", "level"] = "batch"
    weight_temperature: float = 0.2  # T of the RWR weight exp(R_env / T)

    def check(self) -> None:
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.beta < 0 or self.k < 0 or self.weight_temperature <= 0:
            raise ValueError("beta and k must be >= 0 and weight_temperature > 0")
        if not 0 <= self.alpha - self.lead <= 1:
            raise ValueError(f"alpha - lead must be in [0, 1], got {self.alpha - self.lead:g}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, got {self.granularity!r}")


def env_reward(p_hat: float, config: CurriculumConfig) -> float:
    return math.exp(-config.beta * (p_hat - config.alpha + config.lead) ** 2)


def in_band(p_hat: float, config: CurriculumConfig) -> bool:
    return abs(p_hat - config.alpha) <= config.k + 1e-12


@dataclass
class GroupScore:
    batch_id: str
    task_ids: list[str]
    p_hat: float
    env_reward: float
    weight: float
    filtered: bool
    n_rollouts: int
    n_success: int


def score_groups(
    batch_id: str, successes: dict[str, list[bool]], config: CurriculumConfig, levels: dict[str, float] | None = None
) -> list[GroupScore]:
    """Score one batch of tasks (task id -> its rollouts' successes) at the configured granularity; at level
    granularity `levels` gives each task's difficulty level (a task it leaves out is in a group of its own).

    Tasks without rollouts (invalid generations) are not part of any group."""
    groups: dict[str, dict[str, list[bool]]] = {}
    for task_id, task_successes in successes.items():
        if config.granularity == "batch":
            group_id = batch_id
        elif config.granularity == "level" and levels is not None and task_id in levels:
            group_id = f"{batch_id}:level{levels[task_id]:g}"
        else:
            group_id = f"{batch_id}:{task_id}"
        groups.setdefault(group_id, {})[task_id] = task_successes
    scores = []
    for group_id, members in groups.items():
        members = {t: s for t, s in members.items() if s}
        n = sum(len(s) for s in members.values())
        if n == 0:
            continue
        wins = sum(sum(s) for s in members.values())
        p_hat = wins / n
        reward = env_reward(p_hat, config)
        scores.append(
            GroupScore(
                group_id,
                sorted(members),
                p_hat,
                reward,
                math.exp(reward / config.weight_temperature),
                not in_band(p_hat, config),
                n,
                wins,
            )
        )
    return scores


def in_band_share(scores: list) -> float:
    """The share of scored tasks whose group is in the band, over GroupScores or the BatchScored events made of
    them (a group counts once per task, so that a level's group of five tasks weighs five of a task's own)."""
    tasks = sum(len(s.task_ids) for s in scores)
    return sum(len(s.task_ids) for s in scores if not s.filtered) / tasks if tasks else 0.0
