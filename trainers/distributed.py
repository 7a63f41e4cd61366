"""Data-parallel updates through Hugging Face accelerate: several processes, one update, one checkpoint.

    genenv train agent --num-processes 2 ...        # on one machine (torchrun underneath; gloo on CPUs)
    accelerate launch --num_processes 8 -m engine.cli train agent --pool-version V --parent P ...

accelerate does what it is for: it reads the launcher's environment, sets up the process group (gloo on
CPUs, NCCL on GPUs), wraps the model in `prepare` and reduces the gradients in `backward`. The trainer
config's `fsdp` option (TrainingArguments' name: "full_shard" or "shard_grad_op") shards the model with
FSDP2 instead of replicating it with DDP; accelerate shards on GPUs only, so on CPUs it is refused before
any work (`check_sharding`). Either way the checkpoint is gathered whole with `get_state_dict` (a
collective: every rank takes part) and written by rank 0. What is ours
is the rule for which rows each rank trains on, kept in `rank_batches`, a plain function the CPU tests
exercise: every rank reads the same pool version (resolved once, before the ranks start), the rows are put
in one seeded order, cut into global batches of per_device_train_batch_size x world rows, and each rank
takes an equal, contiguous slice of each. The average of the ranks' gradients is then the gradient of the
global batch for losses that are means over rows (RWR, GRPO with loss_type "grpo"); "bnpo" and "dr_grpo"
without max_completion_length normalise by each rank's own tokens, as TRL's GRPOTrainer does per process.
Only rank 0 writes, hashes and publishes the checkpoint; the others wait for it.

Untested beyond the CPU: multi-GPU DDP and FSDP have not run (README, "What has not run"); on CPU the DDP
path runs in the tests, and with it the gather-then-rank-0-writes path FSDP uses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def world_size() -> int:
    """Processes of this update, as the launcher (torchrun, accelerate launch) set them; 1 without one."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_sharding(fsdp: str, device: str) -> None:
    """Raise ValueError when the update cannot shard as asked: FSDP needs CUDA devices."""
    if fsdp and device == "cpu":
        raise ValueError(
            f"fsdp={fsdp!r} shards over GPUs, and accelerate runs CPU processes data-parallel only: "
            "leave fsdp empty (DDP) on CPUs"
        )


def accelerator(cpu: bool, fsdp: str = "", dtype=None):
    """The process group's Accelerator, or None in a single process (whose update stays bit-identical to a
    plain torch loop, so replays of single-process checkpoints never depend on accelerate). fsdp: "" for DDP,
    else FSDP2 (`fsdp_plugin`); dtype: the update's compute dtype (a torch dtype; None: fp32)."""
    if world_size() <= 1:
        return None
    from accelerate import Accelerator

    if not fsdp:
        return Accelerator(cpu=cpu)
    check_sharding(fsdp, "cpu" if cpu else "cuda")
    return Accelerator(fsdp_plugin=fsdp_plugin(fsdp, dtype))


def fsdp_plugin(fsdp: str, dtype=None):
    """FSDP2 with every decoder layer its own shard unit; "full_shard" also frees the gathered weights after each
    layer's forward (least memory), "shard_grad_op" keeps them until the backward (less communication). Under
    mixed precision the layers' weights are gathered and computed in `dtype` and the gradients reduced in fp32,
    while the shards (the master weights the optimiser steps) stay fp32; without a policy FSDP gathers fp32
    weights, twice the bytes and memory of bf16's."""
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mixed = dtype is not None and dtype != torch.float32
    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=fsdp == "full_shard",
        auto_wrap_policy="transformer_based_wrap",
        state_dict_type="FULL_STATE_DICT",
        mixed_precision_policy=MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if mixed else None,
    )


def rank_batches(order: Sequence[int], per_device: int, rank: int = 0, world: int = 1) -> list[list[int]]:
    """This rank's micro-batches: `order` cut into global batches of per_device x world rows, each split into
    `world` equal contiguous slices. Rows that cannot be split equally (the tail of the last global batch) are
    left out when world > 1; `left_out` counts them."""
    if world == 1:
        return [list(order[i : i + per_device]) for i in range(0, len(order), per_device)]
    batches = []
    for start in range(0, len(order), per_device * world):
        rows = list(order[start : start + per_device * world])
        size = len(rows) // world
        if size:
            batches.append(rows[rank * size : (rank + 1) * size])
    return batches


def left_out(n_rows: int, per_device: int, world: int) -> int:
    """Rows no rank trains on (see rank_batches)."""
    return n_rows - world * sum(len(b) for b in rank_batches(range(n_rows), per_device, 0, world))
