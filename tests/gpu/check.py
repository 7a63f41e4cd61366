"""The GPU check: genenv's trainer pieces on one device, with randomly initialised models built from a config.

    bash tests/gpu/check.sh                       # CUDA, bf16, a Qwen2.5-0.5B-like and a 7B-like model
    bash tests/gpu/check.sh --device cpu --small  # the same steps on the CPU with a small config

It needs only torch, transformers and peft (no Kafka, Delta, Polars or network, no downloaded weights), so
it imports trainers' torch-only modules (models, generation, batching, losses, loop, plan) without the
package's __init__, which pulls in the lake. For each model it:

    1. generates G = 4 samples for 4 prompts with per-rollout seeds (TransformersBackend) and checks that a
       group's samples differ and that the recorded logprobs equal a teacher-forced recomputation;
    2. runs one GRPO step (grpo_loss) and one RWR step (rwr_loss) with fp32 master weights and bf16 autocast
       (the 7B-like model as the paper profile trains it: LoRA on a bf16 base with gradient checkpointing),
       and checks the weights moved and stayed finite;
    3. saves what an update's checkpoint holds (fp32: the master weights, or LoRA merged into the base cast up)
       and reads it back, checking it equal bit for bit, and prints the share of the update a bf16 file loses;
    4. prints tokens/s of generation and of the update, the update's peak memory beside the plan's estimate, and the
       forward plus backward time of the shared-prefix layout against the packed one (8 prompts of 100 tokens,
       G = 4, 12-token completions).

Then, once:

    5. the async mode's memory: every model `genenv run --async` holds on one device at once (two rollout
       workers', the agent trainer's validation and the simulator's generation copies, and both updates with
       their AdamW state), built and stepped in this process; its peak beside `genenv plan --async`'s figure
       for the same models and options (less the CUDA contexts, which are not allocations);
    6. DDP with gradient checkpointing on two ranks (NCCL on two GPUs; gloo with --device cpu; skipped on one
       GPU): one step of 4 accumulated micro-batches all-reduces once, on the last, and the loss sees the
       checkpointing through DDP's wrapper;
    7. tensor parallel 2 with vLLM (two GPUs and vLLM installed; skipped otherwise): a checkpoint's weights
       loaded into both workers in place (collective_rpc) change what the engine generates to what the
       checkpoint's model generates.

Exit 0 when every check holds; one JSON line per model on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def trainers_modules():
    """trainers' torch-only modules, imported as the package `gtrainers` without running trainers/__init__.py."""
    package = importlib.util.module_from_spec(importlib.machinery.ModuleSpec("gtrainers", None, is_package=True))
    package.__path__ = [str(ROOT / "trainers")]
    sys.modules["gtrainers"] = package
    return {
        name: importlib.import_module(f"gtrainers.{name}")
        for name in ("models", "generation", "batching", "losses", "loop", "plan", "distributed")
    }


# The 7B-like model is trained as the paper profile trains Qwen2.5-7B: LoRA adapters on a bf16 base with gradient
# checkpointing (a full fine-tune with fp32 master weights needs ~18 bytes per weight, 127 GiB, before activations).
LORA = {"7b"}

CONFIGS = {  # Qwen2.5-like shapes; "7b" is Qwen2.5-7B's own, "small" runs anywhere
    "small": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
    ),
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}


class Tokens:
    """A stand-in tokenizer over token ids (the model is random: text means nothing), as generation needs one."""

    pad_token_id, eos_token_id = 0, 1

    def __call__(self, prompts, return_tensors=None, padding=False, add_special_tokens=False):
        ids = [[int(t) for t in p.split()] for p in prompts]
        width = max(map(len, ids))
        input_ids = torch.tensor([[0] * (width - len(i)) + i for i in ids])
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        from transformers import BatchEncoding

        return BatchEncoding({"input_ids": input_ids, "attention_mask": mask})

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def check_model(name: str, device: str, dtype: torch.dtype, m) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**CONFIGS[name], max_position_embeddings=1024, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    lora = name in LORA
    with torch.device(device):  # fp32 master weights (or a 16-bit base under LoRA); generation runs under autocast
        model = Qwen2ForCausalLM(config).to(dtype if lora else torch.float32)
    vocab = config.vocab_size
    prompts = [
        " ".join(str(t) for t in torch.randint(3, vocab, (32,), generator=torch.Generator().manual_seed(i)).tolist())
        for i in range(4)
    ]
    group = 4
    gen = m["generation"]
    sampling = gen.SamplingConfig(max_new_tokens=16, temperature=1.0, seed=0)
    seeds = [gen.sample_seed(0, f"task-{i}", r) for i in range(len(prompts)) for r in range(group)]
    backend = gen.TransformersBackend(model, Tokens(), batch_size=16)
    start = time.perf_counter()
    with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
        samples = backend.generate([p for p in prompts for _ in range(group)], sampling, seeds)
    sync(device)
    gen_s = time.perf_counter() - start
    distinct_groups = sum(
        len({tuple(s.token_ids) for s in samples[i * group : (i + 1) * group]}) > 1 for i in range(len(prompts))
    )

    batching, losses, loop = m["batching"], m["losses"], m["loop"]
    tokens = batching.pack([s.prompt_token_ids for s in samples], [s.token_ids for s in samples], 0)
    with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
        recomputed = batching.completion_logps(model, tokens).cpu()
    recorded = torch.tensor([s.logprobs + [0.0] * (tokens.completion_width - len(s.logprobs)) for s in samples])
    gap = ((recomputed - recorded).abs() * tokens.completion_mask).max().item()
    # GRPO's own layout: each prompt encoded once, its group's completions on its cached keys and values.
    shared = batching.pack_shared([s.prompt_token_ids for s in samples], [s.token_ids for s in samples], 0)
    with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
        shared_gap = (
            ((batching.completion_logps(model, shared).cpu() - recomputed).abs() * tokens.completion_mask).max().item()
        )

    options = loop.OptimConfig(
        learning_rate=1e-4, per_device_train_batch_size=len(samples), use_peft=lora, gradient_checkpointing=lora
    )
    if lora:
        model = loop.with_lora(model, options)
    layouts = layout_seconds(model, device, dtype, batching, vocab)
    trained = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    before = {k: p.detach().clone() for k, p in trained[:4] + trained[-4:]}
    rewards = torch.tensor([float(i % 2) for i in range(len(samples))])
    advantages = losses.group_advantages(rewards, torch.arange(len(samples)) // group)
    grpo_config = losses.GRPOLossConfig()

    def grpo_step(_, net):
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            logps = batching.completion_logps(net, shared)
        yield losses.grpo_loss(
            logps,
            recorded.to(logps.device),
            advantages.to(logps.device),
            tokens.completion_mask.to(logps.device),
            grpo_config,
        )

    def rwr_step(_, net):
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            logps = batching.completion_logps(net, tokens)
        weights = losses.rwr_weights(rewards, 0.2).to(logps.device)
        yield losses.rwr_loss(logps, tokens.completion_mask.to(logps.device), weights)

    if device == "cuda":  # the update's own peak, which the plan estimates (generation is planned apart)
        sync(device)
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    grpo_metrics = loop.optimise(model, [None], grpo_step, options)
    rwr_metrics = loop.optimise(model, [None], rwr_step, options)
    sync(device)
    train_s = time.perf_counter() - start
    moved = any(not torch.equal(before[k], p) for k, p in model.named_parameters() if k in before)
    finite = all(torch.isfinite(p).all().item() for p in model.parameters())
    kept, lost_in_bf16 = checkpoint_round_trip(model, before, loop)
    trained_tokens = 2 * int(tokens.attention_mask.sum())

    plan = m["plan"]
    arch = plan.Architecture.from_config({**config.to_dict(), "model_type": "qwen2"})
    estimate = plan.update_plan("agent", arch, options, "bf16" if dtype == torch.bfloat16 else "fp32", 32, 16, 1)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    # Logprobs of the same tokens computed in another batch layout differ by rounding only: little in fp32, more
    # under bf16 autocast, most on a bf16 base (0.14 nats on the random 7B-like model, whose ~152k-way
    # distributions are near uniform); a misaligned position would differ by nats.
    tolerance = 1e-3 if dtype == torch.float32 else 0.25 if lora else 0.05
    return {
        "model": name,
        "parameters": arch.parameters,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "training": "LoRA on a 16-bit base, gradient checkpointing" if lora else "full, fp32 master weights",
        "groups_with_distinct_samples": f"{distinct_groups}/{len(prompts)}",
        "max_logprob_gap": round(gap, 5),
        "shared_prefix_vs_packed_gap": round(shared_gap, 5),
        "grpo_loss": round(grpo_metrics["loss"], 5),
        "rwr_loss": round(rwr_metrics["loss"], 5),
        "weights_moved": moved,
        "finite": finite,
        "checkpoint_keeps_the_update": kept,
        "share_of_changes_a_bf16_file_loses": lost_in_bf16,
        "generation_tokens_per_s": round(sum(len(s.token_ids) for s in samples) / gen_s, 1),
        "update_tokens_per_s": round(trained_tokens / train_s, 1),
        **layouts,
        "peak_memory_gib": round(peak / 2**30, 2) if peak is not None else None,
        "plan_estimate_gib": round(estimate.total / 2**30, 2),
        "ok": distinct_groups == len(prompts)
        and gap < tolerance
        and shared_gap < tolerance
        and moved
        and finite
        and kept,
    }


def layout_seconds(
    model,
    device: str,
    dtype: torch.dtype,
    batching,
    vocab: int,
    repeats: int = 3,
    prompt_tokens: int = 100,
    completion_tokens: int = 12,
    groups: int = 8,
    group: int = 4,
) -> dict:
    """Forward plus backward time of GRPO's shared-prefix layout against the packed one, by default on the
    issue's reference shape: 8 prompts of 100 tokens, G = 4 completions of 12 tokens each (the median of
    `repeats` after a warm-up)."""
    draw = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (prompt_tokens,), generator=draw).tolist() for _ in range(groups)]
    prompts = [p for p in prompts for _ in range(group)]  # each group's rollouts share its prompt
    completions = [torch.randint(3, vocab, (completion_tokens,), generator=draw).tolist() for _ in prompts]
    seconds = {}
    for name, batch in (
        ("packed", batching.pack(prompts, completions, 0)),
        ("shared_prefix", batching.pack_shared(prompts, completions, 0)),
    ):
        times = []
        for _ in range(repeats + 1):
            sync(device)
            start = time.perf_counter()
            with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
                logps = batching.completion_logps(model, batch)
            (logps * batch.completion_mask.to(logps.device)).sum().backward()
            sync(device)
            times.append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
        seconds[name] = sorted(times[1:])[len(times[1:]) // 2]
    return {
        "packed_fwd_bwd_s": round(seconds["packed"], 4),
        "shared_prefix_fwd_bwd_s": round(seconds["shared_prefix"], 4),
        "shared_prefix_speedup": round(seconds["packed"] / seconds["shared_prefix"], 2),
    }


def layout_sweep(name: str, device: str, dtype: torch.dtype, m) -> None:
    """`--layouts`: where the shared-prefix forward starts to pay on this device, one JSON line per shape."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**CONFIGS[name], max_position_embeddings=4096, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.float32)
    for prompt_tokens, completion_tokens, groups, group in (
        (100, 12, 8, 4),
        (256, 64, 8, 4),
        (512, 128, 4, 8),
        (1024, 256, 4, 8),
        (2048, 128, 2, 16),
    ):
        shape = dict(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, groups=groups, group=group)
        print(
            json.dumps(
                {
                    "model": name,
                    **shape,
                    **layout_seconds(model, device, dtype, m["batching"], config.vocab_size, **shape),
                }
            ),
            flush=True,
        )


def checkpoint_round_trip(model, before: dict, loop) -> tuple[bool, float]:
    """What trainers/update.py saves after an update (LoRA merged into the base cast up to fp32; full fine-tuning's
    fp32 master weights), written with save_pretrained and read back: (every weight equal bit for bit, the share
    of the changed weights among `before`'s tensors that a bf16 file would have rounded back to where they were)."""
    import tempfile

    from transformers import AutoModelForCausalLM

    saved = loop.merged(model.float())
    with tempfile.TemporaryDirectory() as folder:
        saved.save_pretrained(folder, safe_serialization=True)
        loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    theirs = loaded.state_dict()
    kept = all(torch.equal(t.cpu(), theirs[k]) for k, t in saved.state_dict().items() if k in theirs)
    changed = lost = 0
    for name, start in before.items():
        name = name.replace("base_model.model.", "").replace(".base_layer", "")
        if name not in theirs or "lora_" in name:
            continue
        now, start = theirs[name], start.float().cpu()
        moved = now != start
        changed += int(moved.sum())
        lost += int((moved & (now.bfloat16() == start.bfloat16())).sum())
    return kept, round(lost / max(changed, 1), 4)


def async_memory(name: str, device: str, dtype: torch.dtype, m, rollout_workers: int = 2) -> dict:
    """Check 5: what the async mode holds on one device at once, measured, beside trainers/plan.py's estimate of it
    for the same architecture and options (the estimate must not be below the measurement: a plan that
    undercounts lets a run start that then runs out of memory)."""
    import tempfile
    from types import SimpleNamespace

    from transformers import Qwen2Config, Qwen2ForCausalLM

    plan, loop, batching = m["plan"], m["loop"], m["batching"]
    config = Qwen2Config(**CONFIGS[name], max_position_embeddings=1024, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    options = loop.OptimConfig(learning_rate=1e-5, per_device_train_batch_size=2)
    completion = 64
    with tempfile.TemporaryDirectory() as folder:
        config.to_json_file(f"{folder}/config.json")
        run = SimpleNamespace(  # the RunConfig fields plan_run reads (the engine, and with it Kafka, is not here)
            dtype="bf16" if dtype == torch.bfloat16 else "fp32",
            agent_model=folder,
            env_model=folder,
            agent=options,
            env=options,
            agent_max_new_tokens=completion,
            env_max_new_tokens=completion,
            mode="genenv",
            backend="transformers",
            rollout_workers=rollout_workers,
            gpu_memory_utilization=0.0,
        )
        estimate = plan.plan_run(run, devices=1, memory_gib=1024, device=device, asynchronous=True)
    if device == "cuda":
        sync(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    held = []
    with torch.device(device):
        for _ in estimate.generation:  # each generation copy in the compute dtype
            held.append(Qwen2ForCausalLM(config).to(dtype))
        draw = torch.Generator().manual_seed(3)
        rows = options.per_device_train_batch_size
        prompts = [torch.randint(3, config.vocab_size, (plan.PROMPT_TOKENS,), generator=draw).tolist()] * rows
        completions = [torch.randint(3, config.vocab_size, (completion,), generator=draw).tolist()] * rows
        tokens = batching.pack(prompts, completions, 0)
        for _ in estimate.updates:  # both updates at once: fp32 master weights, their gradients and AdamW moments
            trainer = Qwen2ForCausalLM(config).float()
            state = loop.OptimizerState()

            def nll(_, net):
                with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
                    logps = batching.completion_logps(net, tokens)
                yield -(logps * tokens.completion_mask.to(logps.device)).sum() / tokens.completion_mask.sum(), {}

            loop.optimise(trainer, [None], nll, options, state=state)
            held.append((trainer, state))  # kept: the next update runs beside this one's weights and moments
    measured = torch.cuda.max_memory_allocated() - start if device == "cuda" else None
    planned = estimate.peak - estimate.processes * plan.CUDA_CONTEXT
    return {
        "check": "async_memory",
        "model": name,
        "device": device,
        "copies": list(estimate.generation),
        "plan_gib": round(planned / 2**30, 2),
        "measured_gib": round(measured / 2**30, 2) if measured is not None else None,
        "ok": measured is None or measured <= planned,
    }


def ddp_rank(rank: int, device: str, port: int, out: str) -> None:
    """One of check 6's two ranks (see tests/test_distributed.py for the same on gloo with a tiny model)."""
    import os

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank)
    )
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from transformers import Qwen2Config, Qwen2ForCausalLM

    m = trainers_modules()
    group = m["distributed"].accelerator(cpu=device == "cpu")
    config = Qwen2Config(**CONFIGS["small"], max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(group.device)
    options = m["loop"].OptimConfig(learning_rate=1e-3, gradient_accumulation_steps=4, gradient_checkpointing=True)
    torch.manual_seed(rank)
    micro_batches = [torch.randint(3, config.vocab_size, (2, 12)).to(group.device) for _ in range(4)]
    calls, reduced, saw_checkpointing = [], [], []

    def counted(state, bucket):
        reduced.append(len(calls) - 1)  # in the backward of the last micro-batch computed
        return allreduce_hook(state, bucket)

    def loss_of(batch, wrapper):
        if not calls:
            wrapper.register_comm_hook(None, counted)
        calls.append(batch)
        saw_checkpointing.append(m["loop"].checkpointed(wrapper))
        yield wrapper(input_ids=batch, labels=batch).loss, {}

    metrics = m["loop"].optimise(model, micro_batches, loss_of, options, accelerator=group)
    result = {
        "reduced_in": sorted(set(reduced)),
        "checkpointed": saw_checkpointing,
        "steps": metrics["optimizer_steps"],
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    group.end_training()


def ddp_checkpointing(device: str) -> dict:
    """Check 6: two ranks, each one step of 4 accumulated micro-batches of a gradient-checkpointed model."""
    import socket
    import tempfile

    import torch.multiprocessing as mp

    if device == "cuda" and torch.cuda.device_count() < 2:
        return {"check": "ddp_checkpointing", "skipped": "needs two GPUs", "ok": True}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(ddp_rank, args=(device, port, out), nprocs=2)
        ranks = [json.loads(Path(out, f"rank{rank}.json").read_text()) for rank in (0, 1)]
    expected = {"reduced_in": [3], "checkpointed": [True] * 4, "steps": 1}
    return {"check": "ddp_checkpointing", "device": device, "ranks": ranks, "ok": all(r == expected for r in ranks)}


def tensor_parallel_reload(m) -> dict:
    """Check 7: a vLLM engine with tensor_parallel_size 2 takes a checkpoint's weights in place in both workers: it
    then generates what an engine built from that checkpoint generates (greedy, the same kernels), not what it
    generated before."""
    import importlib.util
    import tempfile

    if importlib.util.find_spec("vllm") is None or torch.cuda.device_count() < 2:
        return {"check": "tensor_parallel_reload", "skipped": "needs vLLM and two GPUs", "ok": True}
    from transformers import Qwen2Config, Qwen2ForCausalLM

    gen = m["generation"]
    config = Qwen2Config(**CONFIGS["small"], max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
    sampling = gen.SamplingConfig(max_new_tokens=8, temperature=0.0, seed=0)
    prompt = "the random model's prompt"
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
        for seed, folder in ((0, first), (1, second)):
            torch.manual_seed(seed)
            Qwen2ForCausalLM(config).save_pretrained(folder)
            m["models"].tiny_tokenizer().save_pretrained(folder)  # byte-level: its ids are below the vocabulary
        engine = gen.VLLMBackend(first, tensor_parallel_size=2, gpu_memory_utilization=0.2, max_model_len=256)
        before = engine.generate([prompt], sampling)[0].token_ids
        engine.load_weights(second)
        reloaded = engine.generate([prompt], sampling)[0].token_ids
        engine.close()
        fresh = gen.VLLMBackend(second, tensor_parallel_size=2, gpu_memory_utilization=0.2, max_model_len=256)
        expected = fresh.generate([prompt], sampling)[0].token_ids
        fresh.close()
    return {"check": "tensor_parallel_reload", "ok": reloaded == expected and reloaded != before}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    parser.add_argument("--small", action="store_true", help="only the small config (for a CPU)")
    parser.add_argument("--models", nargs="*", help="configs to run: small, 0.5b, 7b")
    parser.add_argument(
        "--layouts",
        action="store_true",
        help="only time the shared-prefix and packed layouts over a range of shapes (full fine-tuning)",
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available here", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    names = args.models or (["small"] if args.small else ["0.5b", "7b"])
    modules = trainers_modules()
    if args.layouts:
        for name in names:
            layout_sweep(name, args.device, dtype, modules)
        return 0
    results = [check_model(name, args.device, dtype, modules) for name in names]
    for result in results:
        print(json.dumps(result), flush=True)
    checks = (
        lambda: async_memory(names[0], args.device, dtype, modules),
        lambda: ddp_checkpointing(args.device),
        lambda: tensor_parallel_reload(modules),
    )
    for check in checks:
        results.append(check())
        print(json.dumps(results[-1]), flush=True)
    return 0 if all(result["ok"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
