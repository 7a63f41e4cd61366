"""What both trainers share: the optimiser options, LoRA, and one pass of micro-batches with accumulation."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Progress = Callable[[int, int], None]  # (micro-batches done, total)
FSDP_MODES = ("", "full_shard", "shard_grad_op")  # TrainingArguments' names; "": DDP


@dataclass
class OptimConfig:
    """Optimiser options, named as in transformers' TrainingArguments / TRL's configs."""

    learning_rate: float = 1e-5
    per_device_train_batch_size: int = 8  # rows per micro-batch
    gradient_accumulation_steps: int = 1  # micro-batches per optimiser step
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    seed: int = 0
    use_peft: bool = False  # train LoRA adapters (peft) instead of every weight; checkpoints hold merged weights
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    gradient_checkpointing: bool = False  # recompute each layer's activations in the backward pass: less memory, ~30% slower
    fsdp: str = ""  # several processes on GPUs: "full_shard" or "shard_grad_op" shard the model (FSDP) instead of DDP

    def check(self) -> None:
        """Raise ValueError naming the first bad option."""
        positive = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "max_grad_norm")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.use_peft and self.lora_r < 1:
            raise ValueError(f"lora_r must be >= 1, got {self.lora_r}")
        if self.fsdp not in FSDP_MODES:
            raise ValueError(f"fsdp must be one of {', '.join(map(repr, FSDP_MODES))}, got {self.fsdp!r}")
        if self.fsdp and self.use_peft:
            raise ValueError("fsdp shards full fine-tuning; LoRA adapters are small enough for DDP (leave fsdp empty)")


@dataclass
class OptimizerCarry:
    """The AdamW state a long-running trainer carries from one update to the next, so consecutive updates continue
    one optimiser. Never saved: a restarted trainer starts a fresh one, and each checkpoint's lineage says which
    it was (metrics "optimizer")."""

    state: dict | None = None
    version: int | None = None  # the checkpoint the state led to: only an update from it may continue it


def with_lora(model, config: OptimConfig):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def merged(model):
    """A plain transformers model: LoRA adapters folded into the weights (a no-op without peft)."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def optimise(model, micro_batches: Sequence[Any], loss_of: Callable[[Any, Any], tuple[torch.Tensor, dict]],
             config: OptimConfig, passes: int = 1, progress: Progress | None = None, accelerator=None,
             carry: OptimizerCarry | None = None) -> dict:
    """`passes` sweeps over the micro-batches, one optimiser step every gradient_accumulation_steps.

    loss_of(micro_batch, model) returns the micro-batch's mean loss and its metrics (it must run the model it is
    given: under DDP that is the wrapper whose backward reduces gradients); the result is their mean over every
    micro-batch, with the number of optimiser steps and the last grad norm. accelerator: with several processes
    (trainers/distributed.py), accelerate wraps the model and optimiser and reduces the gradients; every rank
    must then hold the same number of micro-batches. carry: the optimiser starts from carry.state when it holds
    one, and leaves its own state there."""
    params = [p for p in model.parameters() if p.requires_grad]
    # On CUDA, torch's fused AdamW: one kernel, and no temporary the size of the moments (the default foreach
    # step allocates one for sqrt(v): 4 bytes per trained weight, which is what took a 7B full fine-tune on one
    # H200 out of memory in tests/gpu/check.py).
    fused = bool(params) and all(p.is_cuda for p in params) or None
    optimiser = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay, fused=fused)
    if carry is not None and carry.state is not None:
        optimiser.load_state_dict(carry.state)
    train_model = model
    if accelerator is not None:
        train_model, optimiser = accelerator.prepare(model, optimiser)
        params = [p for p in train_model.parameters() if p.requires_grad]  # FSDP replaces them with shards
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()  # LoRA: the frozen embeddings' output must carry gradients through
    model.train()
    accumulate = config.gradient_accumulation_steps
    total = passes * len(micro_batches)
    sums: dict[str, float] = defaultdict(float)
    steps, grad_norm = 0, 0.0
    for i in range(total):
        loss, metrics = loss_of(micro_batches[i % len(micro_batches)], train_model)
        if accelerator is not None:
            accelerator.backward(loss / accumulate)
        else:
            (loss / accumulate).backward()
        sums["loss"] += loss.item()
        for name, value in metrics.items():
            sums[name] += value
        if (i + 1) % accumulate == 0 or i + 1 == total:
            clip = accelerator.clip_grad_norm_ if accelerator is not None else torch.nn.utils.clip_grad_norm_
            grad_norm = float(clip(params, config.max_grad_norm))
            optimiser.step()
            optimiser.zero_grad(set_to_none=True)
            steps += 1
        if progress:
            progress(i + 1, total)
    model.eval()
    if carry is not None:
        carry.state = optimiser.state_dict()
    return {**{k: v / max(total, 1) for k, v in sums.items()}, "optimizer_steps": steps, "grad_norm": grad_norm}
