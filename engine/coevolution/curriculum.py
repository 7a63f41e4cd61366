"""The alpha-curriculum: how the simulator is rewarded for tasks the agent solves about alpha of the time.

For a group of rollouts (one batch of tasks, as in the paper, or one task's G rollouts at task
granularity) with empirical success rate p_hat:

    R_env(p_hat) = exp(-beta * (p_hat - alpha)^2)      highest (1) at p_hat = alpha
    filtered     = |p_hat - alpha| > k                 left out of the simulator's update
    weight       = exp(R_env / T)                      the RWR weight before normalisation

The paper uses alpha = 0.5 and k = 0.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass
class CurriculumConfig:
    alpha: float = 0.5  # the target success rate
    beta: float = 10.0  # sharpness of R_env around alpha
    k: float = 0.1  # half-width of the band kept for the simulator's update
    granularity: Literal["batch", "task"] = "batch"
    weight_temperature: float = 0.2  # T of the RWR weight exp(R_env / T)

    def check(self) -> None:
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.beta < 0 or self.k < 0 or self.weight_temperature <= 0:
            raise ValueError("beta and k must be >= 0 and weight_temperature > 0")
        if self.granularity not in ("batch", "task"):
            raise ValueError(f"granularity must be batch or task, got {self.granularity!r}")


def env_reward(p_hat: float, config: CurriculumConfig) -> float:
    return math.exp(-config.beta * (p_hat - config.alpha) ** 2)


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


def score_groups(batch_id: str, successes: dict[str, list[bool]], config: CurriculumConfig) -> list[GroupScore]:
    """Score one batch of tasks (task id -> its rollouts' successes) at the configured granularity.

    Tasks without rollouts (invalid generations) are not part of any group."""
    groups = (
        {batch_id: successes}
        if config.granularity == "batch"
        else {f"{batch_id}:{task_id}": {task_id: s} for task_id, s in successes.items()}
    )
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
