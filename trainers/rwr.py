"""RWR for the environment simulator, over its own generations: rows of gold/d_env at one Delta version.

Reward-weighted regression: the NLL of each generation, weighted by exp(R_env / T) normalised
over the rows kept, plus a KL penalty to the initial simulator so that it keeps writing tasks
the domain can parse. Rows outside the curriculum band (`filtered`) and generations that did not
parse (`valid` false) are left out. TRL has no per-sample-weighted SFT, so this loop is ours;
the loss is trainers/losses.py's rwr_loss.

The trainer reads rows of (prompt, text, env_reward). With equal rewards and kl_coef 0 it is plain
supervised fine-tuning, which is how the seed warm-start trains both models (trainers/update.py).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass

import polars as pl
import torch

from .batching import TokenBatch, completion_logps, pack
from .distributed import rank_batches
from .loop import OptimConfig, OptimizerState, Progress, optimise, with_lora
from .losses import rwr_loss, rwr_weights


@dataclass
class RWRConfig(OptimConfig):
    weight_temperature: float = 0.2  # T in exp(R_env / T): lower concentrates the update on the best generations
    kl_coef: float = 0.05  # KL penalty to the initial simulator (0 disables it)
    num_train_epochs: int = 1  # passes over the rows per update

    def check(self) -> None:
        super().check()
        if self.weight_temperature <= 0 or self.kl_coef < 0 or self.num_train_epochs < 1:
            raise ValueError("weight_temperature must be > 0, kl_coef >= 0 and num_train_epochs >= 1")


@dataclass
class MicroBatch:
    tokens: TokenBatch
    weights: torch.Tensor  # mean 1 over every kept row
    ref_logps: torch.Tensor | None


def select_rows(rows: pl.DataFrame) -> tuple[pl.DataFrame, Counter]:
    """d_env rows the simulator is trained on, as (prompt, text, env_reward); the others counted by why."""
    dropped = Counter({"filtered": int(rows["filtered"].sum()), "invalid": int((~rows["valid"] & ~rows["filtered"]).sum())})
    kept = rows.filter(pl.col("valid") & ~pl.col("filtered")).sort(["batch_id", "task_id"])
    return kept.select(pl.col("sim_prompt").alias("prompt"), pl.col("raw_generation").alias("text"), "env_reward"), +dropped


class RWRTrainer:
    """compute: a context manager every forward pass runs in (mixed precision's autocast; none by default)."""

    def __init__(self, model, tokenizer, config: RWRConfig, ref_model=None, compute=contextlib.nullcontext,
                 accelerator=None):
        config.check()
        if config.kl_coef and ref_model is None:
            raise ValueError("kl_coef > 0 needs the initial simulator as reference model")
        self.config = config
        self.tokenizer = tokenizer
        self.model = with_lora(model, config) if config.use_peft else model
        self.ref_model = ref_model
        self.compute = compute
        self.accelerator = accelerator  # several processes: this rank's share of the rows (trainers/distributed.py)
        self.rank, self.world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)

    def micro_batches(self, rows: pl.DataFrame) -> list[MicroBatch]:
        cfg, tok = self.config, self.tokenizer
        weights = rwr_weights(torch.tensor(rows["env_reward"].to_list()), cfg.weight_temperature) * rows.height
        prompts = tok(rows["prompt"].to_list(), add_special_tokens=False)["input_ids"]
        # The text is trained on up to and including end-of-sequence, so the model learns where to stop.
        generations = [ids + [tok.eos_token_id] for ids in tok(rows["text"].to_list(), add_special_tokens=False)["input_ids"]]
        order = torch.randperm(rows.height, generator=torch.Generator().manual_seed(cfg.seed)).tolist()
        batches = []
        for indices in rank_batches(order, cfg.per_device_train_batch_size, self.rank, self.world):
            tokens = pack([prompts[i] for i in indices], [generations[i] for i in indices], tok.pad_token_id)
            ref = None
            if cfg.kl_coef:
                with torch.no_grad(), self.compute():
                    ref = completion_logps(self.ref_model, tokens).cpu()
            batches.append(MicroBatch(tokens, weights[indices], ref))
        return batches

    def train(self, rows: pl.DataFrame, progress: Progress | None = None, state: OptimizerState | None = None) -> dict:
        """One update over `rows` (already selected by `select_rows`); returns its metrics. state: where the
        optimiser starts (the parent update's), left holding where it ended (trainers/loop.py)."""
        torch.manual_seed(self.config.seed)
        batches = self.micro_batches(rows)

        def loss_of(mb: MicroBatch, model):
            with self.compute():
                logps = completion_logps(model, mb.tokens)
            on = lambda t: None if t is None else t.to(logps.device)  # noqa: E731
            # rwr_loss takes weights that sum to 1; these average 1, so divide by the micro-batch size.
            return rwr_loss(logps, on(mb.tokens.completion_mask), on(mb.weights / len(mb.weights)), self.config.kl_coef,
                            on(mb.ref_logps))

        metrics = optimise(self.model, batches, loss_of, self.config, self.config.num_train_epochs, progress,
                           self.accelerator, state)
        weights = torch.cat([mb.weights for mb in batches]) / rows.height
        return {**metrics, "rows": rows.height, "env_reward_mean": rows["env_reward"].mean(),
                "effective_sample_size": float(1.0 / (weights ** 2).sum())}
