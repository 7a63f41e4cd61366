"""GRPO for the agent, over rollouts that already exist: rows of gold/d_train at one Delta version.

Why a small torch loop and not TRL's GRPOTrainer: GRPOTrainer owns the sampling step. Its
`rollout_func` hook can hand back pre-generated completions, but the trainer still drives
everything from a prompt dataset: it repeats each prompt `num_generations` times, asks the hook
for that many completions, scores them with reward functions it calls itself, and picks the
batches. Here the rollouts, their rewards and their behaviour log-probabilities were produced by
other workers (possibly by older policies) and sit in the lake; pushing them back through that
loop would mean a fake prompt dataset and reward functions that look rewards up. What GRPO *is*
lives in trainers/losses.py with TRL's option names and formulas, and is held equal to TRL's own loss
(a GRPOTrainer's `_compute_loss` on the same rows and log-probabilities, every loss type and the options
that change the formula: tests/test_trl_parity.py); this module is only the reading of rows, the
staleness rule, batching and the optimiser.

The ratio's denominator (TRL's old policy) is the parent's log-probabilities, recomputed by the trainer at the
start of the update and fixed across its num_iterations passes; the log-probabilities the sampler recorded only
weight each token by min(pi_parent / pi_sampler, importance_sampling_cap), TRL's truncated importance-sampling
correction (`vllm_importance_sampling_correction`). One weight covers both ways the sampler differs from the
trainer: another engine (vLLM's kernels and batching) and an older agent. A row carries the agent version that
produced it: rows 1..max_staleness versions behind are trained so (`off_policy="truncate"`) or dropped
(`"drop"`); rows further behind are always dropped.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Literal

import polars as pl
import torch

from .batching import SharedPrefixBatch, TokenBatch, completion_logps, pack, pack_shared, supervised_ids
from .distributed import rank_batches
from .generation import prompt_token_ids
from .loop import OptimConfig, Trainer
from .losses import GRPOLossConfig, group_advantages, grpo_loss, token_nll

# A guide row: a task's reference answer, written as one more rollout of a group the agent never solved (LUFFY's
# off-policy guidance, arXiv 2504.14945; engine/coevolution/roles.py `Rollouts.guidance`), with the agent's own
# log-probabilities of its tokens. Its rollout id ends so; `most_informative` trains such groups first.
GUIDE_SUFFIX = "-guide"


@dataclass
class GRPOConfig(OptimConfig, GRPOLossConfig):
    num_iterations: int = 1  # passes over the rows per update (TRL's mu)
    temperature: float = 1.0  # the temperature the rollouts were sampled at: their logprobs are of softmax(logits / T)
    max_staleness: int = 1  # rows from agents more than this many versions behind the parent are dropped
    off_policy: Literal["truncate", "drop"] = "truncate"  # what to do with rows 1..max_staleness versions behind
    importance_sampling_cap: float = 2.0  # TRL's vllm_importance_sampling_cap
    # Leave out the groups whose rewards are all equal (DAPO's dynamic sampling, verl's filter_groups): their
    # advantage is 0, so they only dilute a token-normalised loss and cost a forward and backward pass.
    filter_groups: bool = True
    # At most this many groups an update trains on (0: all), the most informative first (the largest spread of
    # rewards; ties in a seeded order); the others are counted as left out. An update's time is its steps, and
    # its steps are its rows: the bound makes a run with many mixed groups cost what an average one does.
    max_groups: int = 0
    # PPO-ptx (InstructGPT's pretraining mix; OpenRLHF's ptx_coef): every micro-batch also takes ptx_batch_size of the
    # warm start's reference answers and adds ptx_coef x their mean token NLL to the loss. GRPO moves only what its
    # mixed groups cover; when those are all one-call tasks, every answer it reinforces stops after one call and the
    # warm start's multi-call answers decay (docs/RESULTS.md, e4 and e5). 0: no such term (nor without a warm start).
    ptx_coef: float = 0.0
    ptx_batch_size: int = 2

    def check(self) -> None:
        super().check()
        choices = {
            "loss_type": ("grpo", "bnpo", "dr_grpo", "dapo"),
            "scale_rewards": ("group", "batch", "none"),
            "importance_sampling_level": ("token", "sequence"),
            "off_policy": ("truncate", "drop"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.epsilon <= 0 or (self.epsilon_high is not None and self.epsilon_high <= 0):
            raise ValueError("epsilon and epsilon_high must be > 0")
        if self.ptx_coef < 0 or self.ptx_batch_size < 1:
            raise ValueError(f"ptx_coef must be >= 0, ptx_batch_size >= 1: {self.ptx_coef}, {self.ptx_batch_size}")
        if self.max_groups < 0:
            raise ValueError(f"max_groups must be >= 0 (0: every group), got {self.max_groups}")
        if self.beta < 0 or self.max_staleness < 0 or self.num_iterations < 1 or self.temperature <= 0:
            raise ValueError("beta and max_staleness must be >= 0, num_iterations >= 1, temperature > 0")


@dataclass
class MicroBatch:
    tokens: SharedPrefixBatch
    old_logps: torch.Tensor  # the ratio's denominator, (batch, C)
    advantages: torch.Tensor  # (batch,)
    token_weights: torch.Tensor | None  # min(pi_parent / pi_sampler, cap) per token
    ref_logps: torch.Tensor | None
    reference_answers: TokenBatch | None = None  # the ptx term's rows (warm-start answers), when ptx_coef > 0
    step_tokens: float | None = None  # dapo: its optimiser step's completion tokens per micro-batch of the step


def staleness_of(version: str, parent_version: int) -> int | None:
    try:
        return parent_version - int(version)
    except ValueError:
        return None


def turns_of(rows: pl.DataFrame) -> list[list[dict] | None]:
    """Each d_train row's turns (a multi-turn rollout's: engine/coevolution/roles.py `Rollouts.play`); [] for a
    single-turn row, and for every row of a pool version from before the column; None where a producer's text is
    not turns that can be trained on (each with a prompt, and as many log-probabilities as reply tokens)."""
    if "turns_json" not in rows.columns:
        return [[] for _ in range(rows.height)]
    return [readable_turns(text) for text in rows["turns_json"].to_list()]


def readable_turns(text: str | None) -> list[dict] | None:
    try:
        turns = json.loads(text or "[]")
    except (ValueError, RecursionError):
        return None
    return turns if isinstance(turns, list) and all(trainable_turn(t) for t in turns) else None


def trainable_turn(turn) -> bool:
    """A turn GRPO can train: a prompt, and as many log-probabilities as the reply has tokens (at least one)."""
    if not isinstance(turn, dict) or not isinstance(turn.get("prompt"), str):
        return False
    ids, logps = turn.get("token_ids"), turn.get("logprobs")
    return isinstance(ids, list) and isinstance(logps, list) and 0 < len(ids) == len(logps)


def select_rows(rows: pl.DataFrame, parent_version: int, config: GRPOConfig) -> tuple[pl.DataFrame, Counter]:
    """The rows this update may train on, with their staleness; the others counted by why they were left out."""
    dropped: Counter = Counter()
    kept = []
    for row in rows.sort(["task_id", "group_index", "rollout_id"]).iter_rows(named=True):
        staleness = staleness_of(row["agent_model_version"], parent_version)
        ids, logps = row["completion_token_ids"] or [], row["behaviour_logprobs"] or []
        if readable_turns(row.get("turns_json")) is None:
            dropped["unreadable_turns"] += 1  # a producer's turns_json that no turn can be trained from
        elif staleness is None:
            dropped["unknown_version"] += 1
        elif staleness < 0:
            dropped["newer_than_parent"] += 1
        elif staleness > config.max_staleness or (staleness > 0 and config.off_policy == "drop"):
            dropped["stale"] += 1
        elif not ids or len(ids) != len(logps):
            dropped["no_token_logprobs"] += 1
        elif row.get("temperature") is not None and abs(row["temperature"] - config.temperature) > 1e-9:
            dropped["other_temperature"] += 1  # its logprobs are of another softmax: the ratio would be wrong
        else:
            kept.append({**row, "staleness": staleness})
    if config.filter_groups:
        rewards: dict[str, set[float]] = {}
        for row in kept:
            rewards.setdefault(row["task_id"], set()).add(row["reward"])
        mixed = [row for row in kept if len(rewards[row["task_id"]]) > 1]
        if len(mixed) < len(kept):
            dropped["zero_std_group"] += len(kept) - len(mixed)
        kept = mixed
    if config.max_groups:
        kept, over = most_informative(kept, config.max_groups, config.seed)
        if over:
            dropped["over_max_groups"] += over
    return pl.DataFrame(kept, infer_schema_length=None) if kept else rows.clear(), dropped


class GRPOTrainer(Trainer):
    """GRPO over selected rows (`select_rows`): group-relative advantages, the clipped ratio, `beta`'s KL term, and
    `ptx_coef`'s supervised term on the warm start's reference answers (`anchor`: rows of prompt and text, as
    trainers/update.py's `warm_start_rows` gives them)."""

    kl_option = "beta"

    def __init__(self, *args, anchor: pl.DataFrame | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.anchor = anchor if self.config.ptx_coef and anchor is not None and anchor.height else None

    @property
    def passes(self) -> int:
        return self.config.num_iterations

    def micro_batches(self, rows: pl.DataFrame, step: int = 0) -> list[MicroBatch]:
        """Advantages over each task's group, then micro-batches in a seeded order of tasks, a task's rollouts
        side by side (so a micro-batch encodes their shared prompt once: trainers/batching.py), with every
        log-probability that does not depend on the weights being trained computed up front. step: the lineage's
        optimiser steps before this update (where the ptx term's rows continue from: `reference_answers`)."""
        cfg = self.config
        rewards = torch.tensor(rows["reward"].to_list(), dtype=torch.float32)
        task_ids = rows["task_id"].to_list()
        group_of = {task_id: i for i, task_id in enumerate(dict.fromkeys(task_ids))}
        advantages = group_advantages(rewards, torch.tensor([group_of[t] for t in task_ids]), cfg.scale_rewards)
        # A multi-turn rollout trains as its turns: each turn's reply is a completion of that turn's own prompt, which
        # holds what the environment said, so only the agent's tokens are ever in the loss; each turn carries its
        # trajectory's advantage. A single-turn rollout is one piece, itself.
        prompts_of, ids_of, logps_of = (
            rows[c].to_list() for c in ("prompt", "completion_token_ids", "behaviour_logprobs")
        )
        pieces = []  # (the rollout's row, prompt text, completion token ids, behaviour log-probabilities)
        for i, turns in enumerate(turns_of(rows)):
            if turns:
                pieces += [(i, t["prompt"], t["token_ids"], t["logprobs"]) for t in turns]
            else:
                pieces.append((i, prompts_of[i], ids_of[i], logps_of[i]))
        task_ids = [task_ids[p[0]] for p in pieces]
        advantages = advantages[torch.tensor([p[0] for p in pieces], dtype=torch.long)]
        prompts_text, completions_of, behaviours_of = (
            [p[1] for p in pieces],
            [p[2] for p in pieces],
            [p[3] for p in pieces],
        )
        prompts = prompt_token_ids(self.tokenizer, prompts_text)
        order = grouped_order(task_ids, cfg.seed)
        batches = []
        for indices in rank_batches(order, cfg.per_device_train_batch_size, self.rank, self.world):
            completions = [list(completions_of[i]) for i in indices]
            tokens = pack_shared([prompts[i] for i in indices], completions, self.tokenizer.pad_token_id)
            behaviour = _pad([list(behaviours_of[i]) for i in indices], tokens.completion_width)
            # As TRL: the ratio's denominator is the policy at the start of the update, recomputed by this model
            # (fixed across the update's passes), and the sampler's own log-probabilities only weight each token by
            # min(pi_old / pi_sampler, cap), the truncated importance-sampling correction. That one weight covers
            # both ways the sampler differs from the trainer: an older agent (stale rows) and another engine (vLLM's
            # bf16 kernels and batching, where the two disagree even for the same weights).
            with torch.no_grad(), self.compute():
                old = completion_logps(self.model, tokens, cfg.temperature).float().cpu()
            weights = torch.exp(old - behaviour).clamp(max=cfg.importance_sampling_cap)
            ref = self.reference_logps(tokens, cfg.temperature)
            batches.append(MicroBatch(tokens, old, advantages[indices], weights, ref))
        for i, batch in enumerate(self.reference_answers(len(batches), step)):
            batches[i].reference_answers = batch
        steps = cfg.gradient_accumulation_steps  # the micro-batches of a step, as `optimise` groups them
        for start in range(0, len(batches), steps):
            step = batches[start : start + steps]
            tokens = sum(float(mb.tokens.completion_mask.sum()) for mb in step)
            for mb in step:
                mb.step_tokens = tokens / len(step)
        return batches

    def reference_answers(self, n: int, step: int = 0) -> list[TokenBatch]:
        """ptx_batch_size anchor rows for each of n micro-batches: the anchor in one seeded order, taken in turn from
        where the lineage's earlier updates left it (and again from the start when it runs out), each rank from its
        own place in that order. Where the earlier updates left it is counted from the lineage's optimiser steps
        (`step`): steps x gradient_accumulation_steps / num_iterations micro-batches came before this update.
        Each update used to start again from the top of the order: the default's updates of 8 micro-batches of 2
        rows took the same 16 of the warm start's 24 answers every time, and never the other 8 (docs/RESULTS.md,
        "The ptx rows in turn")."""
        if self.anchor is None:
            return []
        cfg, tok, rows = self.config, self.tokenizer, self.anchor
        prompts, answers = supervised_ids(tok, rows["prompt"].to_list(), rows["text"].to_list())
        order = torch.randperm(rows.height, generator=torch.Generator().manual_seed(cfg.seed + 1)).tolist()
        size, before = cfg.ptx_batch_size, step * cfg.gradient_accumulation_steps // cfg.num_iterations
        batches = []
        for i in range(n):
            start = ((before + i) * self.world + self.rank) * size
            indices = [order[(start + j) % rows.height] for j in range(size)]
            batches.append(pack([prompts[k] for k in indices], [answers[k] for k in indices], tok.pad_token_id))
        return batches

    def loss(self, mb: MicroBatch, model):
        """The ptx term on the reference answers, then GRPO's term, each backpropagated before the next is computed:
        one backward over their sum held both forward passes' activations at once. The ptx rows (whole prompts and
        answers, where GRPO's rows share one prompt) have the larger activations, so they go first, while the
        gradients are not yet allocated (docs/RESULTS.md, "Time and memory")."""
        device = next(model.parameters()).device
        on = lambda t: None if t is None else t.to(device)  # noqa: E731
        if mb.reference_answers is not None:
            with self.compute():
                answer_logps = completion_logps(model, mb.reference_answers)
            nll = token_nll(answer_logps, on(mb.reference_answers.completion_mask))
            yield self.config.ptx_coef * nll, {"ptx_nll": nll.item()}
        with self.compute():
            logps = completion_logps(model, mb.tokens, self.config.temperature)
        yield grpo_loss(
            logps,
            on(mb.old_logps),
            on(mb.advantages),
            on(mb.tokens.completion_mask),
            self.config,
            on(mb.ref_logps),
            on(mb.token_weights),
            mb.step_tokens,
        )

    def summary(self, rows: pl.DataFrame, batches: list[MicroBatch]) -> dict:
        zero_std = rows.group_by("task_id").agg(pl.col("reward").n_unique() == 1)["reward"].mean()
        return {
            "rows": rows.height,
            "groups": rows["task_id"].n_unique(),
            "reward_mean": rows["reward"].mean(),
            "zero_std_groups_frac": zero_std,
            "stale_rows": int((rows["staleness"] > 0).sum()),
            "ptx_rows": 0 if self.anchor is None else self.anchor.height,
        }


def most_informative(rows: list[dict], groups: int, seed: int) -> tuple[list[dict], int]:
    """The rows of the `groups` tasks with a guide row (`GUIDE_SUFFIX`) first, then of those whose rewards spread
    the most (population std: for 0/1 rewards, p nearest 0.5), ties in a seeded order of tasks; and how many rows
    were left out. A guided group's one right answer among eight wrong spreads less than any sampled 1-in-8, so by
    spread alone no guide row was ever trained where an epoch had max_groups mixed groups (docs/RESULTS.md)."""
    rewards: dict[str, list[float]] = {}
    for row in rows:
        rewards.setdefault(row["task_id"], []).append(row["reward"])
    guided = {row["task_id"] for row in rows if row["rollout_id"].endswith(GUIDE_SUFFIX)}
    tasks = list(rewards)
    order = torch.randperm(len(tasks), generator=torch.Generator().manual_seed(seed)).tolist()
    rank = {tasks[k]: i for i, k in enumerate(order)}
    spread = {t: statistics.pstdev(r) for t, r in rewards.items()}
    chosen = set(sorted(tasks, key=lambda t: (t not in guided, -spread[t], rank[t]))[:groups])
    kept = [row for row in rows if row["task_id"] in chosen]
    return kept, len(rows) - len(kept)


def grouped_order(task_ids: list[str], seed: int) -> list[int]:
    """Row indices with each task's rows together, in their own order, and the tasks in a seeded random order."""
    rows_of: dict[str, list[int]] = {}
    for i, task_id in enumerate(task_ids):
        rows_of.setdefault(task_id, []).append(i)
    tasks = list(rows_of)
    shuffled = torch.randperm(len(tasks), generator=torch.Generator().manual_seed(seed)).tolist()
    return [i for k in shuffled for i in rows_of[tasks[k]]]


def _pad(rows: list[list[float]], width: int) -> torch.Tensor:
    return torch.tensor([r + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32)
