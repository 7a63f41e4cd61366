"""Benchmark: generation and GRPO on smollm2-135m, each against a baseline run in the same process.

    .venv/bin/python tests/bench/trainers.py [--model smollm2-135m] [--batch 32] [--tokens 32]

Prints JSON:
- generation: tokens/s of batched generation (`--batch` prompts at once) against one prompt at a
  time on a subset of the same prompts (target ratio >= 8 at batch 32);
- grpo_step: seconds of one GRPO update over a micro-batch of 8 rollouts against a plain
  forward + backward + AdamW step of the same tokens with the usual causal-LM loss (target <= 1.2);
- grpo_peak_rss_mib: peak RSS of a child process that loads the model and runs that GRPO step
  (target <= 4096);
- plan: `genenv plan`'s estimate of that update (trainers/plan.py: master weights, gradients, AdamW state,
  activations and logits, plus the child's resident libraries measured before the model loads) beside the
  measured peak (target: within 25%);
- data_parallel: seconds of one GRPO update of 16 rows in 2 processes (torchrun, gloo, 8 rows per rank) against
  1 process (16 rows per micro-batch), the same global batch;
- shared_prefix: forward + backward of GRPO's logprobs with each prompt encoded once for its group
  (trainers/batching.py) against the packed forward that repeats it per rollout, on the default run's real
  shapes: two toolcall validation prompts with the agent's chat template, G rollouts each sampled up to
  agent_max_new_tokens, with activations recomputed in the backward pass as the default's updates do
  (kept, the packed layout of these 16 rows needs about 15 GB); and the same for the issue's reference shape
  (8 prompts of 100 tokens, 12-token completions), activations kept. Also the largest logprob difference
  between the two (target: under 1e-4 in float32);
- epoch (`--only epoch`, not in the default set: minutes): the default run's first epoch timed per phase with
  the shared-prefix forward and with the packed one, from one warm start and the same seed (the phases'
  seconds, and before_epoch: loading, the warm start for the first layout, the validation before training).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

QUESTIONS = [f"What is the weather in city number {i}? Call get_weather." for i in range(64)]


def rollout_rows(loaded, tokens: int, rows: int = 8):
    """Real rollouts of the model (sampled), shaped like gold/d_train rows."""
    import polars as pl

    from trainers import SamplingConfig, TransformersBackend, render_prompt

    prompts = [render_prompt(loaded.tokenizer, q) for q in QUESTIONS[: rows // 4]]
    backend = TransformersBackend(loaded.model, loaded.tokenizer, batch_size=rows)
    gens = backend.generate([p for p in prompts for _ in range(4)], SamplingConfig(max_new_tokens=tokens, seed=0))
    return pl.DataFrame(
        [
            {
                "rollout_id": f"r{i}",
                "task_id": f"t{i // 4}",
                "group_index": i % 4,
                "agent_model_version": "0",
                "prompt": g.prompt,
                "completion": g.text,
                "completion_token_ids": g.token_ids,
                "behaviour_logprobs": g.logprobs,
                "reward": float(i % 2),
                "staleness": 0,
            }
            for i, g in enumerate(gens)
        ]
    )


def bench_generation(loaded, batch: int, tokens: int, singles: int) -> dict:
    from trainers import SamplingConfig, TransformersBackend, render_prompt

    prompts = [render_prompt(loaded.tokenizer, q) for q in QUESTIONS[:batch]]
    # min_new_tokens-free sampling can stop early; count the tokens actually produced.
    sampling = SamplingConfig(max_new_tokens=tokens, temperature=1.0, seed=0)
    batched = TransformersBackend(loaded.model, loaded.tokenizer, batch_size=batch)
    batched.generate(prompts[:2], sampling)  # warm-up
    start = time.perf_counter()
    produced = sum(len(g.token_ids) for g in batched.generate(prompts, sampling))
    batched_rate = produced / (time.perf_counter() - start)
    single = TransformersBackend(loaded.model, loaded.tokenizer, batch_size=1)
    start = time.perf_counter()
    produced = sum(len(g.token_ids) for g in single.generate(prompts[:singles], sampling))
    single_rate = produced / (time.perf_counter() - start)
    return {
        "batch": batch,
        "batched_tokens_per_s": round(batched_rate, 1),
        "single_tokens_per_s": round(single_rate, 1),
        "ratio": round(batched_rate / single_rate, 2),
        "target_ratio": 8.0,
    }


def bench_grpo_step(loaded, tokens: int, repeats: int) -> dict:
    import torch

    from trainers import GRPOConfig, GRPOTrainer
    from trainers.batching import pack

    rows = rollout_rows(loaded, tokens)
    config = GRPOConfig(per_device_train_batch_size=8, learning_rate=1e-6)
    trainer = GRPOTrainer(loaded.model, loaded.tokenizer, config)
    prompt_ids = loaded.tokenizer(rows["prompt"].to_list(), add_special_tokens=False)["input_ids"]
    batch = pack(prompt_ids, [r.to_list() for r in rows["completion_token_ids"]], loaded.tokenizer.pad_token_id)
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    optimiser = torch.optim.AdamW(loaded.model.parameters(), lr=1e-6)

    def plain_step():
        loaded.model.train()
        loss = loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
        loss.backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)

    plain_step()  # warm-up, both paths
    trainer.train(rows)
    plain, grpo = [], []
    for _ in range(repeats):  # interleaved, so drift on a shared machine hits both alike
        start = time.perf_counter()
        plain_step()
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        trainer.train(rows)
        grpo.append(time.perf_counter() - start)
    p, g = statistics.median(plain), statistics.median(grpo)
    return {
        "rows": rows.height,
        "completion_tokens": int(batch.completion_mask.sum()),
        "plain_step_s": round(p, 3),
        "grpo_step_s": round(g, 3),
        "ratio": round(g / p, 3),
        "target_ratio": 1.2,
    }


def grpo_rss_child(model: str, tokens: int, queue) -> None:
    from trainers import GRPOConfig, GRPOTrainer, load_model
    from trainers.plan import architecture, update_plan

    libraries = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    loaded = load_model(model)
    rows = rollout_rows(loaded, tokens)
    config = GRPOConfig(per_device_train_batch_size=8)
    GRPOTrainer(loaded.model, loaded.tokenizer, config).train(rows)
    prompt = max(len(ids) for ids in loaded.tokenizer(rows["prompt"].to_list(), add_special_tokens=False)["input_ids"])
    completion = max(len(ids) for ids in rows["completion_token_ids"].to_list())
    estimate = update_plan("agent", architecture(model), config, "fp32", prompt, completion, 1).total + libraries
    queue.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, estimate / 2**20, libraries / 2**20))


def data_parallel_update(model: str, tokens: int, rows_per_device: int) -> None:
    """One GRPO update of 16 rows, timed, in this process (run under torchrun for several); rank 0 prints seconds."""
    import torch

    from trainers import GRPOConfig, GRPOTrainer, load_model
    from trainers.distributed import accelerator

    loaded = load_model(model)
    rows = rollout_rows(loaded, tokens, rows=16)
    group = accelerator(cpu=True)
    trainer = GRPOTrainer(
        loaded.model,
        loaded.tokenizer,
        GRPOConfig(per_device_train_batch_size=rows_per_device, loss_type="grpo"),
        accelerator=group,
    )
    start = time.perf_counter()
    trainer.train(rows)
    if group is None or group.is_main_process:
        print(json.dumps({"seconds": time.perf_counter() - start, "threads": torch.get_num_threads()}), flush=True)


def bench_shared_prefix(loaded, repeats: int) -> dict:
    import torch

    from engine.coevolution import load_config
    from engine.domains import get_domain
    from trainers import SamplingConfig, TransformersBackend, render_prompt
    from trainers.batching import completion_logps, pack, pack_shared

    config = load_config("default")
    domain = get_domain(config.domain)
    tasks = domain.validation_set(8)[4:6]  # two-call requests: the prompts of a mid-ladder group
    prompts = [render_prompt(loaded.tokenizer, domain.agent_prompt(t), system=domain.agent_system) for t in tasks]
    backend = TransformersBackend(loaded.model, loaded.tokenizer, batch_size=32)
    group = config.group_size
    samples = backend.generate(
        [p for p in prompts for _ in range(group)], SamplingConfig(max_new_tokens=config.agent_max_new_tokens, seed=0)
    )
    default_shape = ([s.prompt_token_ids for s in samples], [s.token_ids for s in samples])
    g = torch.Generator().manual_seed(0)
    reference = [torch.randint(3, 5000, (100,), generator=g).tolist() for _ in range(8)]
    reference_shape = (
        [p for p in reference for _ in range(4)],
        [torch.randint(3, 5000, (12,), generator=g).tolist() for _ in range(32)],
    )

    def timed(batch) -> tuple[float, torch.Tensor]:
        loaded.model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logps = completion_logps(loaded.model, batch)
        (logps * batch.completion_mask).sum().backward()
        return time.perf_counter() - start, logps.detach()

    from trainers.loop import recompute_activations

    out = {}
    loaded.model.train(False)
    for name, (prompt_ids, completion_ids) in (("reference", reference_shape), ("default_run", default_shape)):
        if name == "default_run":
            recompute_activations(loaded.model)
            loaded.model.train(True)  # recomputation acts in training mode; the model has no dropout
        packed = pack(prompt_ids, completion_ids, loaded.tokenizer.pad_token_id)
        shared = pack_shared(prompt_ids, completion_ids, loaded.tokenizer.pad_token_id)
        timed(packed), timed(shared)  # warm-up
        packed_s, shared_s = [], []
        for _ in range(repeats):  # interleaved, so drift on a shared machine hits both alike
            seconds, packed_logps = timed(packed)
            packed_s.append(seconds)
            seconds, shared_logps = timed(shared)
            shared_s.append(seconds)
        real = packed.completion_mask.bool()
        p, s = statistics.median(packed_s), statistics.median(shared_s)
        out[name] = {
            "rows": len(prompt_ids),
            "prompts": shared.prompt_ids.shape[0],
            "prompt_tokens_mean": round(sum(map(len, prompt_ids)) / len(prompt_ids), 1),
            "completion_tokens_mean": round(float(packed.completion_mask.sum()) / len(prompt_ids), 1),
            "packed_s": round(p, 3),
            "shared_prefix_s": round(s, 3),
            "speedup": round(p / s, 2),
            "activations_recomputed": name == "default_run",
            "max_logprob_difference": float((packed_logps[real] - shared_logps[real]).abs().max()),
        }
    loaded.model.zero_grad(set_to_none=True)
    return out


def bench_epoch(profile: str) -> dict:
    """The first epoch of a run of `profile` (the default run), with GRPO's shared-prefix forward and with the
    packed one it replaced: one warm start, then that epoch twice from it on one lake and broker with the same
    config and seed, the second time with trainers.grpo.pack_shared swapped for the packed layout. The two runs'
    task ids differ (they name the run), and with them the rollouts' sampling seeds: the update's rows and mean
    completion length are printed beside the times. Seconds per phase of each epoch (the sync loop's laps)."""
    import tempfile

    import trainers.grpo
    from engine.coevolution import CoEvolution, LakeWriter, load_config
    from lake import Lake
    from streams import LocalBroker
    from trainers.batching import pack

    config = load_config(profile, None, ["epochs=1"])
    seconds = {}
    with tempfile.TemporaryDirectory() as folder, LocalBroker() as broker:
        lake = Lake(Path(folder) / "lake")
        start_from = (0, 0)
        shared_prefix = trainers.grpo.pack_shared
        for layout in ("shared_prefix", "packed"):
            trainers.grpo.pack_shared = shared_prefix if layout == "shared_prefix" else pack
            run = dataclasses.replace(config, warm_start=start_from == (0, 0))
            started = time.perf_counter()
            with LakeWriter(lake, broker.bootstrap) as writer:
                engine = CoEvolution(run, lake, writer, say=lambda *_: None, start_from=start_from)
                metrics = engine.run()
            start_from = engine.warm_started
            seconds[layout] = {phase: round(s, 1) for phase, s in metrics[0].seconds.items()}
            seconds[layout]["epoch"] = round(sum(metrics[0].seconds.values()), 1)
            # Before the epoch: loading, the warm start (the first layout only) and the validation before training.
            seconds[layout]["before_epoch"] = round(time.perf_counter() - started - seconds[layout]["epoch"], 1)
            seconds[layout]["agent_update"] = metrics[0].updates.get("agent", "")
            seconds[layout]["response_tokens"] = metrics[0].response_tokens
        trainers.grpo.pack_shared = shared_prefix
    return {
        "profile": profile,
        **seconds,
        "train_agent_speedup": round(
            seconds["packed"]["train_agent"] / max(seconds["shared_prefix"]["train_agent"], 1e-9), 2
        ),
        "epoch_speedup": round(seconds["packed"]["epoch"] / max(seconds["shared_prefix"]["epoch"], 1e-9), 2),
    }


def bench_data_parallel(model: str, tokens: int) -> dict:
    import subprocess

    script = [str(Path(__file__).resolve()), "--model", model, "--tokens", str(tokens), "--update-only"]
    one = subprocess.run([sys.executable, *script, "16"], capture_output=True, text=True, check=True)
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *script, "8"],
        capture_output=True,
        text=True,
        check=True,
    )
    one_s = json.loads(one.stdout.strip().splitlines()[-1])["seconds"]
    two_s = json.loads(two.stdout.strip().splitlines()[-1])["seconds"]
    return {
        "rows": 16,
        "one_process_s": round(one_s, 2),
        "two_processes_s": round(two_s, 2),
        "ratio": round(two_s / one_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--singles", type=int, default=4, help="prompts generated one at a time for the baseline")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--update-only", type=int, metavar="ROWS_PER_DEVICE", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=["shared_prefix", "epoch"], help="run one part only")
    parser.add_argument("--profile", default="default", help="--only epoch: the run profile whose first epoch is timed")
    args = parser.parse_args()
    if args.update_only:
        data_parallel_update(args.model, args.tokens, args.update_only)
        return

    import torch

    from trainers import load_model

    if args.only == "epoch":
        print(json.dumps({"threads": torch.get_num_threads(), "epoch": bench_epoch(args.profile)}, indent=2))
        return
    if args.only == "shared_prefix":
        print(
            json.dumps(
                {
                    "model": args.model,
                    "threads": torch.get_num_threads(),
                    "shared_prefix": bench_shared_prefix(load_model(args.model), args.repeats),
                },
                indent=2,
            )
        )
        return
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=grpo_rss_child, args=(args.model, args.tokens, queue))
    child.start()
    peak_mib, estimate_mib, libraries_mib = queue.get()
    child.join()

    loaded = load_model(args.model)
    result = {
        "model": args.model,
        "threads": torch.get_num_threads(),
        "generation": bench_generation(loaded, args.batch, args.tokens, args.singles),
        "grpo_step": bench_grpo_step(loaded, args.tokens, args.repeats),
        "grpo_peak_rss_mib": round(peak_mib, 1),
        "target_peak_rss_mib": 4096,
        "plan": {
            "estimate_mib": round(estimate_mib, 1),
            "measured_peak_mib": round(peak_mib, 1),
            "libraries_mib": round(libraries_mib, 1),
            "measured_over_estimate": round(peak_mib / estimate_mib, 3),
            "target": "within 0.75-1.25",
        },
        "data_parallel": bench_data_parallel(args.model, args.tokens),
        "shared_prefix": bench_shared_prefix(loaded, args.repeats),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
