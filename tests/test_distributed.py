"""Data-parallel updates (trainers/distributed.py): a 2-process update on real gloo process groups gives the weights
a 1-process update over the same global batch gives, and only rank 0 writes, hashes and publishes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import genenv_cli
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file
from test_trainers import publish_epoch

from lake import Lake, ingest, read_pool
from streams.broker import free_port
from trainers import load_model, registry
from trainers.distributed import left_out, rank_batches


@pytest.mark.unit
@given(n=st.integers(0, 200), per_device=st.integers(1, 9), world=st.integers(1, 5))
def test_ranks_take_disjoint_equal_deterministic_shares(n, per_device, world):
    order = list(range(n))
    shares = [rank_batches(order, per_device, rank, world) for rank in range(world)]
    assert len({len(s) for s in shares}) == 1, "every rank holds the same number of micro-batches"
    for step in zip(*shares):
        assert len({len(b) for b in step}) == 1 and all(len(b) <= per_device for b in step)
    rows = [i for share in shares for batch in share for i in batch]
    assert len(rows) == len(set(rows)) == n - left_out(n, per_device, world)
    assert left_out(n, per_device, world) < world
    assert shares == [rank_batches(order, per_device, rank, world) for rank in range(world)]
    if world == 1:
        assert shares[0] == [order[i : i + per_device] for i in range(0, n, per_device)]


@pytest.mark.unit
def test_fsdp_gathers_weights_in_the_compute_dtype_and_reduces_gradients_in_fp32():
    import torch

    from trainers.distributed import fsdp_plugin

    mixed = fsdp_plugin("full_shard", torch.bfloat16)
    policy = mixed.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed.reshard_after_forward and not fsdp_plugin("shard_grad_op").reshard_after_forward
    assert fsdp_plugin("full_shard", torch.float32).mixed_precision_policy is None  # fp32: nothing to cast


@pytest.fixture
def two_lakes(broker, lake, runner, tmp_path) -> tuple[Lake, Lake]:
    publish_epoch(broker.bootstrap)
    ingest(lake, broker.bootstrap, idle_exit_s=1.5, runner=runner)
    assert read_pool(lake, "d_train").height == 16 and read_pool(lake, "d_env").height == 4
    copy = tmp_path / "copy"
    shutil.copytree(lake.root, copy)
    return lake, Lake(copy, create=False)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "kind, rows, options",
    [
        ("agent", 16, ["loss_type=grpo", "learning_rate=1e-3", "seed=3"]),  # a mean over rows, as RWR's loss is
        ("env", 4, ["learning_rate=1e-3", "seed=3"]),
    ],
)
def test_a_2_process_update_equals_a_1_process_update_over_the_same_global_batch(
    two_lakes, broker, kind, rows, options
):
    single, double = two_lakes
    per_rank = 4 if kind == "agent" else 2
    sets = [a for o in options for a in ("--set", o)]
    one = genenv_cli(
        "train",
        kind,
        "--lake",
        single.root,
        "--model",
        "tiny",
        "--bootstrap",
        broker.bootstrap,
        *sets,
        "--set",
        f"per_device_train_batch_size={2 * per_rank}",
        timeout=600,
    )
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-3000:]
    two = genenv_cli(
        "train",
        kind,
        "--lake",
        double.root,
        "--model",
        "tiny",
        "--bootstrap",
        broker.bootstrap,
        *sets,
        "--set",
        f"per_device_train_batch_size={per_rank}",
        "--num-processes",
        "2",
        timeout=600,
    )
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-3000:]

    a = load_file(str(Path(single.root) / "checkpoints" / kind / "v1" / "model.safetensors"))
    b = load_file(str(Path(double.root) / "checkpoints" / kind / "v1" / "model.safetensors"))
    base = load_model("tiny").model.state_dict()
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert max((a[k] - base[k]).abs().max().item() for k in a) > 1e-4, "the update did not move the weights"
    for lake_ in (single, double):  # one registry row and one folder per update: rank 1 wrote nothing
        assert registry(lake_, kind).height == 1
        assert sorted(p.name for p in (Path(lake_.root) / "checkpoints" / kind).iterdir()) == ["v1"]
    assert two.stdout.count(f"{kind} v1") == 1  # rank 0's summary, printed once
    assert "processes" in two.stdout


def accumulating_rank(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: one optimiser step of 4 accumulated micro-batches of a gradient-checkpointed tiny
    model through `optimise` with accelerate's DDP. Writes, for its rank, the micro-batches whose backward
    all-reduced a gradient bucket and whether the loss saw a checkpointed model through the DDP wrapper."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank)
    )
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from trainers import GRPOConfig
    from trainers.distributed import accelerator
    from trainers.loop import checkpointed, optimise

    model = load_model("tiny").model
    group = accelerator(cpu=True)
    config = GRPOConfig(learning_rate=1e-3, gradient_accumulation_steps=4, gradient_checkpointing=True)
    torch.manual_seed(rank)
    micro_batches = [torch.randint(3, 200, (2, 12)) for _ in range(4)]
    calls, reduced, saw_checkpointing = [], [], []  # calls: the micro-batch each loss_of call computed

    def counted(state, bucket):
        reduced.append(len(calls) - 1)  # in the backward of the last micro-batch computed
        return allreduce_hook(state, bucket)

    def loss_of(batch, wrapper):
        if not calls:  # the first call: the wrapper exists and no backward has run yet
            wrapper.register_comm_hook(None, counted)
        calls.append(batch)
        saw_checkpointing.append(checkpointed(wrapper))
        yield wrapper(input_ids=batch, labels=batch).loss, {}

    metrics = optimise(model, micro_batches, loss_of, config, accelerator=group)
    Path(out, f"rank{rank}.json").write_text(
        json.dumps(
            {"reduced_in": sorted(set(reduced)), "checkpointed": saw_checkpointing, "steps": metrics["optimizer_steps"]}
        )
    )
    group.end_training()


@pytest.mark.e2e
def test_accumulated_micro_batches_reduce_once_a_step_and_keep_checkpointing_under_ddp(tmp_path):
    """Two gloo processes: DDP all-reduces on the step's last micro-batch only (no_sync before it), and the loss,
    which receives the DDP wrapper, sees the checkpointed model inside (it read False through the wrapper, and the
    shared-prefix forward ran with its cache on under checkpointing)."""
    import torch.multiprocessing as mp

    mp.spawn(accumulating_rank, args=(free_port(), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result == {"reduced_in": [3], "checkpointed": [True] * 4, "steps": 1}, (rank, result)
