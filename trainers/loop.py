"""What both trainers share: the optimiser options, LoRA, the learning-rate schedule, the passes of
micro-batches with accumulation, and the Trainer base GRPO and RWR extend.

The optimiser is one AdamW across a lineage of updates: each update starts from the state its parent's update
ended with (OptimizerState, saved beside the checkpoint as optimizer.pt by trainers/update.py) and continues
its learning-rate schedule from the step it reached. A fresh AdamW per update would make every update one first
Adam step from zero moments: a move of about +-lr per weight whatever its gradient, sign descent rather than
Adam. The schedule is transformers' (`get_scheduler`, TrainingArguments' option names), counted in optimiser
steps over the lineage, not within one update.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .batching import completion_logps
from .heap import release_free_heap

Progress = Callable[[int, int], None]  # (micro-batches done, total)
FSDP_MODES = ("", "full_shard", "shard_grad_op")  # TrainingArguments' names; "": DDP
SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine")  # TrainingArguments' lr_scheduler_type names


@dataclass
class OptimConfig:
    """Optimiser options, named as in transformers' TrainingArguments / TRL's configs."""

    learning_rate: float = 1e-5
    per_device_train_batch_size: int = 8  # rows per micro-batch
    gradient_accumulation_steps: int = (
        1  # micro-batches per optimiser step (the last step of a pass takes what is left)
    )
    # The schedule spans the lineage's optimiser steps (every update continues it). linear and cosine decay to 0 at
    # max_steps (and stay there); warmup_steps, or warmup_ratio of max_steps, ramp up from 0 first.
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    max_steps: int = 0  # optimiser steps over the whole lineage; needed by linear, cosine and warmup_ratio
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    seed: int = 0
    use_peft: bool = False  # train LoRA adapters (peft) instead of every weight; checkpoints hold merged weights
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    gradient_checkpointing: bool = (
        False  # recompute each layer's activations in the backward pass: less memory, ~30% slower
    )
    # Train every weight but the token embeddings (and the output head, where it is tied to them): no gradients
    # and no AdamW moments for them. In SmolLM2-135M they are 28M of 135M weights, 0.34 GB of the update's
    # gradients and moments.
    freeze_embeddings: bool = False
    fsdp: str = ""  # several processes on GPUs: "full_shard" or "shard_grad_op" shard the model (FSDP) instead of DDP

    def check(self) -> None:
        """Raise ValueError naming the first bad option."""
        positive = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "max_grad_norm")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.lr_scheduler_type not in SCHEDULES:
            raise ValueError(f"lr_scheduler_type must be one of {', '.join(SCHEDULES)}, got {self.lr_scheduler_type!r}")
        if self.warmup_steps < 0 or not 0 <= self.warmup_ratio < 1 or self.max_steps < 0:
            raise ValueError("warmup_steps and max_steps must be >= 0, warmup_ratio in [0, 1)")
        if (self.lr_scheduler_type in ("linear", "cosine") or self.warmup_ratio) and not self.max_steps:
            raise ValueError(
                f"lr_scheduler_type {self.lr_scheduler_type!r} and warmup_ratio need max_steps (the "
                "lineage's optimiser steps) > 0"
            )
        if self.use_peft and self.lora_r < 1:
            raise ValueError(f"lora_r must be >= 1, got {self.lora_r}")
        if self.fsdp not in FSDP_MODES:
            raise ValueError(f"fsdp must be one of {', '.join(map(repr, FSDP_MODES))}, got {self.fsdp!r}")
        if self.fsdp and self.use_peft:
            raise ValueError("fsdp shards full fine-tuning; LoRA adapters are small enough for DDP (leave fsdp empty)")
        if self.fsdp and self.freeze_embeddings:
            raise ValueError("fsdp flattens trained and frozen weights together: leave freeze_embeddings off with it")

    @property
    def warmup(self) -> int:
        return self.warmup_steps or math.ceil(self.warmup_ratio * self.max_steps)

    @property
    def schedule(self) -> str:
        """transformers' scheduler for lr_scheduler_type: "constant" is taken with its warmup (0 steps: none)."""
        return "constant_with_warmup" if self.lr_scheduler_type == "constant" else self.lr_scheduler_type


@dataclass
class OptimizerState:
    """Where an update's optimiser starts and what it leaves: AdamW's state dict (None: a fresh optimiser) and the
    optimiser steps the lineage has taken (where the learning-rate schedule stands)."""

    optimizer: dict | None = None
    step: int = 0


def lr_schedule(optimiser, config: OptimConfig, start: int):
    """transformers' schedule for the options, standing at lineage step `start` (its lr is the next step's)."""
    from transformers import get_scheduler

    for group in optimiser.param_groups:
        group["lr"] = group["initial_lr"] = config.learning_rate
    scheduler = get_scheduler(
        config.schedule, optimiser, num_warmup_steps=config.warmup, num_training_steps=config.max_steps or None
    )
    if config.max_steps:  # transformers' cosine climbs again past num_training_steps: held where it ended instead
        scheduler.lr_lambdas = [lambda step, f=f: f(min(step, config.max_steps)) for f in scheduler.lr_lambdas]
    if start:
        with warnings.catch_warnings():  # stepped before the optimiser on purpose: it resumes a lineage
            warnings.simplefilter("ignore", UserWarning)
            scheduler.last_epoch = start - 1
            scheduler.step()
    return scheduler


def with_lora(model, config: OptimConfig):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def merged(model):
    """A plain transformers model: LoRA adapters folded into the weights (a no-op without peft)."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def optimise(
    model,
    micro_batches: Sequence[Any],
    loss_of: Callable[[Any, Any], Iterable[tuple[torch.Tensor, dict]]],
    config: OptimConfig,
    passes: int = 1,
    progress: Progress | None = None,
    accelerator=None,
    state: OptimizerState | None = None,
) -> dict:
    """`passes` sweeps over the micro-batches, one optimiser step every gradient_accumulation_steps.

    A step's loss is the mean over the micro-batches it actually has (the last step of a pass may have fewer), so
    every step has the size the learning rate means. loss_of(micro_batch, model) yields the micro-batch's mean loss
    in terms, each with its metrics (it must run the model it is given: under DDP that is the wrapper whose backward
    reduces gradients); each term is backpropagated before the next is computed, so that only one term's forward
    activations are alive at a time (GRPO's ptx term is a second forward pass over other rows). The result is the
    metrics' mean over every micro-batch (a micro-batch's loss is the sum of its terms), with the number of optimiser
    steps, the last learning rate and grad norm. accelerator: with several processes (trainers/distributed.py),
    accelerate wraps the model and optimiser and reduces the gradients (on every term's backward of a step's last
    micro-batch: an average of gradients that already agree across ranks leaves them as they are); every rank must
    then hold the same number of micro-batches. state: where the optimiser and its schedule start (a fresh AdamW at
    step 0 when None or empty); the optimiser's state at the end is left there."""
    params = [p for p in model.parameters() if p.requires_grad]
    # torch's fused AdamW on CUDA and on the CPU: one kernel, and no temporary the size of the moments (the
    # default foreach step on CUDA allocates one for sqrt(v): 4 bytes per trained weight, which is what took a 7B
    # full fine-tune on one H200 out of memory in tests/gpu/check.py); on 2 CPU cores a step of the 135M agent
    # takes 0.08 s fused against 0.33 s in the default per-tensor loop.
    fused = bool(params) and all(p.device.type in ("cuda", "cpu") for p in params) or None
    optimiser = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay, fused=fused)
    state = state if state is not None else OptimizerState()
    if state.optimizer is not None:
        saved = sum(len(group["params"]) for group in state.optimizer["param_groups"])
        if saved != len(params):
            raise ValueError(
                f"the optimiser state this update continues is for {saved} weight tensors, and it trains "
                f"{len(params)}: freeze_embeddings differs from the update it continues"
            )
        optimiser.load_state_dict(state.optimizer)
        for group in optimiser.param_groups:  # the moments carry on; the options are this update's
            group["weight_decay"] = config.weight_decay
    scheduler = lr_schedule(optimiser, config, state.step)
    train_model = model
    if accelerator is not None:
        train_model, optimiser = accelerator.prepare(model, optimiser)
        params = [p for p in train_model.parameters() if p.requires_grad]  # FSDP replaces them with shards
    if config.gradient_checkpointing:
        recompute_activations(model)
    model.train()
    accumulate, n = config.gradient_accumulation_steps, len(micro_batches)
    total = passes * n
    sums: dict[str, float] = defaultdict(float)
    steps, grad_norm, lr = 0, 0.0, scheduler.get_last_lr()[0]
    for i in range(total):
        k = i % n  # the micro-batch's place in its pass; steps never straddle two passes
        in_step = min(accumulate, n - k // accumulate * accumulate)  # micro-batches of the step it belongs to
        ends_step = (k + 1) % accumulate == 0 or k + 1 == n
        # DDP all-reduces the gradients in every backward unless told not to: once, on a step's last micro-batch,
        # gives the same sum with 1/accumulate of the traffic (accelerate's no_sync; a no-op in one process).
        with (
            accelerator.no_sync(train_model) if accelerator is not None and not ends_step else contextlib.nullcontext()
        ):
            for loss, metrics in loss_of(micro_batches[k], train_model):
                if accelerator is not None:
                    accelerator.backward(loss / in_step)
                else:
                    (loss / in_step).backward()
                sums["loss"] += loss.item()
                for name, value in metrics.items():
                    sums[name] += value
                # The heap the term's backward freed given back, as the warm start does after each micro-batch
                # (trainers/heap.py): each term's logits and activations come in their own sizes, and what they left
                # behind piled up (with this and the call in `Trainer.train`, the agent's updates of 8-row
                # micro-batches peaked at 3.40-3.58 GB against 4.06-4.37, the simulator's at 3.26-3.40 against
                # 3.70-3.97: e119 and e118 of docs/RESULTS.md).
                release_free_heap()
        if ends_step:
            clip = accelerator.clip_grad_norm_ if accelerator is not None else torch.nn.utils.clip_grad_norm_
            grad_norm = float(clip(params, config.max_grad_norm))
            lr = scheduler.get_last_lr()[0]
            optimiser.step()
            scheduler.step()
            optimiser.zero_grad(set_to_none=True)
            steps += 1
        if progress:
            progress(i + 1, total)
    model.eval()
    state.optimizer, state.step = optimiser.state_dict(), state.step + steps
    return {
        **{k: v / max(total, 1) for k, v in sums.items()},
        "optimizer_steps": steps,
        "lineage_steps": state.step,
        "learning_rate": lr,
        "grad_norm": grad_norm,
    }


def checkpointed(model) -> bool:
    """Whether the model recomputes activations in the backward pass. Asked of the model inside DDP's wrapper,
    which does not pass the attribute through (it read False under DDP)."""
    model = getattr(model, "module", model)
    name = (
        "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else "is_gradient_checkpointing"
    )
    return bool(getattr(model, name, False))


def recompute_activations(model) -> None:
    """Gradient checkpointing: each layer's activations recomputed in the backward pass, not kept (once a model)."""
    if checkpointed(model):
        return
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name; the old one warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()  # LoRA: the frozen embeddings' output must carry gradients through


class Trainer:
    """What GRPO and RWR share: the model (wrapped with LoRA when the config asks), the reference model of the KL
    term, the compute context, this rank's place among the processes, and the update itself: micro-batches built
    once, then `passes` sweeps of optimiser steps (`optimise`). A trainer says only what differs:

        kl_option                  the config field of the KL coefficient (its reference model is required when > 0)
        passes                     sweeps over the micro-batches per update
        micro_batches(rows, step)  the update's micro-batches, with every log-probability that does not move (step:
                                   the lineage's optimiser steps before the update)
        loss(micro_batch, model)   its mean loss in terms, each with its metrics (a generator: `optimise`
                                   backpropagates a term before asking for the next; forward passes under `compute`)
        summary(rows, batches)     the update's own metrics beside the optimiser's

    compute: a context manager every forward pass runs in (mixed precision's autocast; none by default).
    accelerator: several processes, each with its share of the rows (trainers/distributed.py)."""

    kl_option = ""

    def __init__(
        self, model, tokenizer, config: OptimConfig, ref_model=None, compute=contextlib.nullcontext, accelerator=None
    ):
        config.check()
        if getattr(config, self.kl_option, 0) and ref_model is None:
            raise ValueError(f"{self.kl_option} > 0 needs a reference model")
        self.config = config
        self.tokenizer = tokenizer
        if config.freeze_embeddings:
            model.get_input_embeddings().weight.requires_grad_(False)
        self.model = with_lora(model, config) if config.use_peft else model
        if config.gradient_checkpointing:
            # Before `micro_batches`: the ratio's denominator must come from the model the update then trains, as
            # the update runs it, or in bf16 the ratio starts away from 1 by two paths' rounding.
            recompute_activations(self.model)
        self.ref_model = ref_model
        self.compute = compute
        self.accelerator = accelerator
        self.rank, self.world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)

    @property
    def passes(self) -> int:
        return 1

    def reference_logps(self, tokens, *args) -> torch.Tensor | None:
        """The reference model's log-probabilities of a micro-batch's completions, when there is a KL term."""
        if not getattr(self.config, self.kl_option, 0):
            return None
        with torch.no_grad(), self.compute():
            return completion_logps(self.ref_model, tokens, *args).cpu()

    def micro_batches(self, rows, step: int = 0) -> list:
        raise NotImplementedError

    def loss(self, micro_batch, model) -> Iterator[tuple[torch.Tensor, dict]]:
        raise NotImplementedError

    def summary(self, rows, batches: list) -> dict:
        return {}

    def train(self, rows, progress: Progress | None = None, state: OptimizerState | None = None) -> dict:
        """One update over `rows` (already selected); returns its metrics. state: where the optimiser starts (the
        parent update's), left holding where it ended."""
        torch.manual_seed(self.config.seed)
        batches = self.micro_batches(rows, state.step if state is not None else 0)
        # The micro-batches hold the reference's log-probabilities: the reference model (a whole model's weights)
        # is not needed while the gradients and AdamW's moments are, the update's largest moment.
        self.ref_model = None
        # The heap that their forward passes freed, given back before the gradients and moments come.
        release_free_heap()
        metrics = optimise(self.model, batches, self.loss, self.config, self.passes, progress, self.accelerator, state)
        return {**metrics, **self.summary(rows, batches)}
