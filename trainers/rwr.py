"""RWR for the environment simulator, over its own generations: rows of gold/d_env at one Delta version.

Reward-weighted regression: the NLL of each generation, weighted by exp(R_env / T) normalised
over the rows kept, plus a KL penalty to the initial simulator (the warm-started one, where the run has a warm start:
trainers/update.py's `reference_version`) so that it keeps writing tasks
the domain can parse. Generations that did not parse (`valid` false) are left out, and so, with `band_only` (the
paper's filter), are rows outside the curriculum band (`filtered`). Without it every scored valid generation is
trained on and the weight alone tilts the simulator towards the band: the textbook RWR estimate of the same
reward-tilted policy, which at CPU scale (8-16 tasks an epoch, 10-20% of them in band) has rows where the filtered
one has 0-3. TRL has no per-sample-weighted SFT, so this loop is ours; the loss is trainers/losses.py's rwr_loss.

Each row keeps its own weight, so a choice's share of an update is its share of the samples times its weight, and
updates compound it (the simulator of the 5-seed ablation wrote one letter 10 times in 10 by epoch 2 in 4 seeds of
5). Weighing each curriculum group as a whole instead (exp(R_env / T) / n, n its rows) was tried and taken out: the
choice then followed the band, which at level granularity often sat on the easiest letter by chance, and genenv
gained 0.074 less than genenv-random (docs/RESULTS.md, "The ablation with each level weighed as a whole").

The trainer reads rows of (prompt, text, env_reward). With equal rewards and kl_coef 0 it would be plain
supervised fine-tuning; the seed warm start is that, and takes TRL's SFTTrainer instead (trainers/sft.py), with
an RWRConfig's options (recorded in its lineage as every update's).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import polars as pl
import torch

from .batching import TokenBatch, completion_logps, pack, supervised_ids
from .distributed import rank_batches
from .loop import OptimConfig, Trainer
from .losses import rwr_loss, rwr_weights


@dataclass
class RWRConfig(OptimConfig):
    weight_temperature: float = 0.2  # T in exp(R_env / T): lower concentrates the update on the best generations
    kl_coef: float = 0.05  # KL penalty to the initial simulator, the warm-started one if any (0 disables it)
    num_train_epochs: int = 1  # passes over the rows per update
    # Train only on rows in the curriculum band (the paper's k filter); False: on every scored valid generation,
    # weighted by exp(R_env / T), so that a higher weight_temperature keeps the effective sample size up.
    band_only: bool = True
    # An update waits until it has at least this many rows to train on: fewer stay in the pool for the next one
    # (the rows new since the parent's pool version). RWR's weights over a handful of rows put the whole update on
    # one or two generations (an effective sample size of 1-2).
    min_rows: int = 1
    # The temperature the generations were sampled at, which their log-likelihood is scored at (as GRPO's logprobs
    # are, TRL's `temperature`). RWR fits the policy that samples to its own samples tilted by the weights; scored
    # at 1.0, samples drawn at 0.7 are sharper than the model that fits them, so an update sharpened the simulator's
    # choice even where every weight was equal (docs/RESULTS.md, e134 and e135; scored at 0.7 it drifted less onto
    # one letter and gained as much, "e151-e156").
    temperature: float = 1.0

    def check(self) -> None:
        super().check()
        if self.min_rows < 1:
            raise ValueError(f"min_rows must be >= 1, got {self.min_rows}")
        if self.weight_temperature <= 0 or self.kl_coef < 0 or self.num_train_epochs < 1 or self.temperature <= 0:
            raise ValueError("weight_temperature and temperature must be > 0, kl_coef >= 0 and num_train_epochs >= 1")


@dataclass
class MicroBatch:
    tokens: TokenBatch
    weights: torch.Tensor  # mean 1 over every kept row
    ref_logps: torch.Tensor | None


def select_rows(rows: pl.DataFrame, config: RWRConfig) -> tuple[pl.DataFrame, Counter]:
    """d_env rows the simulator is trained on, as (prompt, text, env_reward); the others counted by why. Without
    `band_only`, rows outside the band are kept. A generation sampled at another temperature than the one the
    update scores at is left out, as GRPO leaves out such rollouts: its likelihood would be of another softmax.
    Rows that record none (seed tasks, lakes from before TaskGenerated had it) are scored at `temperature`."""
    left_out = pl.col("filtered") if config.band_only else pl.lit(False)
    sampled_at = pl.col("temperature") if "temperature" in rows.columns else pl.lit(None, pl.Float64)
    other = (sampled_at - config.temperature).abs().gt(1e-9).fill_null(False) & pl.col("valid") & ~left_out
    counts = rows.select(
        filtered=left_out.sum(), invalid=(~pl.col("valid") & ~left_out).sum(), other_temperature=other.sum()
    ).row(0, named=True)
    dropped = Counter({why: int(n) for why, n in counts.items()})
    kept = rows.filter(pl.col("valid") & ~left_out & ~other).sort(["batch_id", "task_id"])
    return kept.select(
        pl.col("sim_prompt").alias("prompt"), pl.col("raw_generation").alias("text"), "env_reward"
    ), +dropped


class RWRTrainer(Trainer):
    """RWR over selected rows (`select_rows`): the weighted NLL of the simulator's generations, `kl_coef`'s KL term."""

    kl_option = "kl_coef"

    @property
    def passes(self) -> int:
        return self.config.num_train_epochs

    def micro_batches(self, rows: pl.DataFrame, step: int = 0) -> list[MicroBatch]:
        cfg, tok = self.config, self.tokenizer
        weights = rwr_weights(torch.tensor(rows["env_reward"].to_list()), cfg.weight_temperature) * rows.height
        prompts, generations = supervised_ids(tok, rows["prompt"].to_list(), rows["text"].to_list())
        order = torch.randperm(rows.height, generator=torch.Generator().manual_seed(cfg.seed)).tolist()
        batches = []
        for indices in rank_batches(order, cfg.per_device_train_batch_size, self.rank, self.world):
            tokens = pack([prompts[i] for i in indices], [generations[i] for i in indices], tok.pad_token_id)
            batches.append(MicroBatch(tokens, weights[indices], self.reference_logps(tokens, cfg.temperature)))
        return batches

    def loss(self, mb: MicroBatch, model):
        with self.compute():
            logps = completion_logps(model, mb.tokens, self.config.temperature)
        on = lambda t: None if t is None else t.to(logps.device)  # noqa: E731
        # rwr_loss takes weights that sum to 1; these average 1, so divide by the micro-batch size.
        weights = on(mb.weights / len(mb.weights))
        yield rwr_loss(logps, on(mb.tokens.completion_mask), weights, self.config.kl_coef, on(mb.ref_logps))

    def summary(self, rows: pl.DataFrame, batches: list[MicroBatch]) -> dict:
        weights = torch.cat([mb.weights for mb in batches]) / rows.height
        return {
            "rows": rows.height,
            "env_reward_mean": rows["env_reward"].mean(),
            "effective_sample_size": float(1.0 / (weights**2).sum()),
        }
