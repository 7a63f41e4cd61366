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
        for name in ("models", "generation", "batching", "losses", "loop", "plan")
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
        return losses.grpo_loss(
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
        return losses.rwr_loss(logps, tokens.completion_mask.to(logps.device), weights)

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
    ok = True
    for name in names:
        result = check_model(name, args.device, dtype, modules)
        print(json.dumps(result), flush=True)
        ok &= result["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
