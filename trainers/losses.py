"""The two objectives, as pure tensor functions: GRPO for the agent, RWR for the simulator.

Option names follow TRL's GRPOConfig (loss_type, epsilon, epsilon_high, beta, scale_rewards,
importance_sampling_level) so users recognise them; the trainers wrap these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class GRPOLossConfig:
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "bnpo"
    epsilon: float = 0.2  # lower clip: ratio >= 1 - epsilon
    epsilon_high: float | None = None  # upper clip (DAPO's clip-higher); defaults to epsilon
    beta: float = 0.0  # KL coefficient to the reference policy (k3 estimator), the warm start if any; 0 disables it
    scale_rewards: Literal["group", "batch", "none"] = "group"
    importance_sampling_level: Literal["token", "sequence"] = "token"
    max_completion_length: int | None = None  # dr_grpo's constant normaliser; defaults to the batch's width
    # The KL term times the (differentiable) ratio, so that its gradient is the unbiased reverse-KL gradient
    # (DeepSeek-V3.2; TRL's default since 1.x): it changes the gradient even where the ratio is exactly 1.
    use_bias_correction_kl: bool = True


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """Reward minus its group's mean, divided by the group's (or the batch's) std unless scale_rewards="none".

    A group whose rewards are all equal gets advantage 0 everywhere, so it contributes no gradient."""
    rewards = rewards.float()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1
    counts = torch.zeros(groups).index_add_(0, inverse, torch.ones_like(rewards))
    means = torch.zeros(groups).index_add_(0, inverse, rewards) / counts
    centred = rewards - means[inverse]
    if scale_rewards == "none":
        return centred
    if scale_rewards == "group":
        # Unbiased std per group, as torch.std (and TRL) compute it; a singleton group has std 0.
        sq = torch.zeros(groups).index_add_(0, inverse, centred**2) / (counts - 1).clamp(min=1)
        return centred / (sq.sqrt()[inverse] + eps)
    if scale_rewards == "batch":
        return centred / (rewards.std() + eps)
    raise ValueError(f"scale_rewards must be group, batch or none, got {scale_rewards!r}")


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GRPOLossConfig,
    ref_logps: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
    step_tokens: float | None = None,
) -> tuple[torch.Tensor, dict]:
    """Clipped-ratio policy loss over completion tokens.

    logps, old_logps, ref_logps, mask, token_weights: (batch, tokens); advantages: (batch,).
    old_logps are the log-probabilities the ratio is taken against (the policy at the start of the update);
    token_weights, when given, the truncated importance weights min(pi_old / pi_sampler, cap) of the tokens
    another engine or an older policy sampled (TRL's importance-sampling correction). step_tokens: dapo's
    normaliser, the completion tokens of the optimiser step this micro-batch is part of, per micro-batch of the
    step (so that the step's mean over its micro-batches is its token sum over all its tokens, as TRL's dapo)."""
    mask = mask.float()
    log_ratio = logps - old_logps
    if config.importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1).expand_as(logps)
    ratio = torch.exp(log_ratio)
    high = config.epsilon if config.epsilon_high is None else config.epsilon_high
    clipped = torch.clamp(ratio, 1 - config.epsilon, 1 + high)
    adv = advantages.unsqueeze(-1)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if token_weights is not None:
        per_token = per_token * token_weights
    kl = None
    if config.beta:
        if ref_logps is None:
            raise ValueError("beta > 0 needs reference log-probabilities")
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1  # k3: unbiased, always >= 0
        per_token = per_token + config.beta * (kl * ratio if config.use_bias_correction_kl else kl)

    if config.loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    elif config.loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
    elif config.loss_type == "dr_grpo":
        width = config.max_completion_length or logps.shape[-1]
        loss = (per_token * mask).sum() / (logps.shape[0] * width)
    elif config.loss_type == "dapo":
        loss = (per_token * mask).sum() / max(step_tokens if step_tokens is not None else mask.sum().item(), 1.0)
    else:
        raise ValueError(f"loss_type must be grpo, bnpo, dr_grpo or dapo, got {config.loss_type!r}")

    with torch.no_grad():
        tokens = mask.sum().clamp(min=1)
        metrics = {
            "clip_ratio": (((ratio < 1 - config.epsilon) | (ratio > 1 + high)).float() * mask).sum().item()
            / tokens.item(),
            "ratio_mean": ((ratio * mask).sum() / tokens).item(),
        }
        if kl is not None:
            metrics["kl"] = ((kl * mask).sum() / tokens).item()
    return loss, metrics


def token_nll(logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean negative log-likelihood over the real tokens of a batch (supervised fine-tuning's loss)."""
    mask = mask.float()
    return -(logps * mask).sum() / mask.sum().clamp(min=1)


def rwr_weights(env_rewards: torch.Tensor, temperature: float, filtered: torch.Tensor | None = None) -> torch.Tensor:
    """Reward-weighted regression weights: exp(R / T), normalised to sum to 1 over the rows kept.

    Filtered rows (outside the curriculum band) get weight 0."""
    if temperature <= 0:
        raise ValueError(f"RWR temperature must be > 0, got {temperature}")
    logits = env_rewards.float() / temperature
    if filtered is not None:
        logits = logits.masked_fill(filtered.bool(), float("-inf"))
    if torch.isinf(logits).all():
        raise ValueError("every row is filtered: nothing to train the simulator on")
    return torch.softmax(logits, dim=0)


def rwr_loss(
    logps: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    kl_coef: float = 0.0,
    ref_logps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """Weighted NLL of the simulator's own generations, plus kl_coef * KL to the initial simulator.

    logps, ref_logps, mask: (batch, tokens); weights: (batch,), summing to 1."""
    mask = mask.float()
    nll = -(logps * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    loss = (weights * nll).sum()
    metrics = {"weighted_nll": loss.item()}
    if kl_coef:
        if ref_logps is None:
            raise ValueError("kl_coef > 0 needs the initial simulator's log-probabilities")
        delta = ref_logps - logps
        kl = ((torch.exp(delta) - delta - 1) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        kl_term = (weights * kl).sum()
        loss = loss + kl_coef * kl_term
        metrics["kl"] = kl_term.item()
    return loss, metrics
