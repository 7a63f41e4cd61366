"""Memory plans: what a run needs on each device, estimated from the models' configs before any model is loaded.

Written by hand because nothing we use computes it: accelerate's `estimate-memory` counts one model's weights
and Adam state (for a hub model it can download), but not two roles, a reference model, activations, the
logits of a long vocabulary, vLLM's reservation or an FSDP split. The estimate is arithmetic over the
architecture (tests/bench/trainers.py sets it beside a measured peak).

What a device holds at the peak of a run, the sync loop's way (one update at a time):

    generation    both roles' models in `dtype` (transformers), or each vLLM engine's reservation
                  (gpu_memory_utilization x device memory; the weights live inside it)
    + the largest update:
      master      the trainer's fp32 weights (with LoRA: the base weights in `dtype`, adapters in fp32); in
                  mixed precision (fp32 master, 16-bit `dtype`) also autocast's 16-bit copy of them, which the
                  backward pass holds (measured on an H200 by tests/gpu/check.py)
      gradients   fp32, of what is trained
      optimizer   AdamW: two fp32 moments of what is trained
      reference   the base model in `dtype`, when beta > 0 (GRPO) or kl_coef > 0 (RWR) (with LoRA too: the
                  parent under the adapters is the last checkpoint, not the base model)
      activations per micro-batch of per_device_train_batch_size sequences, or of GRPO's ptx_batch_size
                  where that is more (Korthikanti et al., 2022: about 34 x hidden bytes per token and layer in
                  16-bit, attention by SDPA; with gradient checkpointing only each layer's 16-bit input is
                  kept, plus one layer's full set), and the completion positions' fp32 logits (three copies:
                  logits, log-softmax, their gradient)

With FSDP over N devices the master weights, gradients and optimizer state are divided by N (full
sharding); with DDP every device holds them whole.

The async mode (`genenv run --async`, `genenv plan --async`) runs its workers at once, each a process of its
own on the same device: the simulator's generation, each rollout worker's, the agent trainer's validation
generation beside its update, and the simulator trainer's update, all held together, plus a CUDA context per
process on a GPU. (The launcher's own models are released before the workers start.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .models import BUILTINS, cache_dir

GIB = 1024**3
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CUDA_CONTEXT = GIB // 2  # what each process on a GPU holds before its first tensor (CUDA context, kernels)
PROMPT_TOKENS = (
    256  # the prompt length the plan assumes (simulator and agent prompts of the built-in domains are shorter)
)


@dataclass(frozen=True)
class Architecture:
    """The sizes of a Llama/Qwen2-style decoder: enough to count its parameters and activations."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    qkv_bias: bool = False

    @property
    def parameters(self) -> int:
        kv = self.hidden // self.heads * self.kv_heads
        attention = (
            2 * self.hidden * self.hidden + 2 * self.hidden * kv + (self.hidden + 2 * kv if self.qkv_bias else 0)
        )
        layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * layer + self.hidden

    @classmethod
    def from_config(cls, config: dict) -> Architecture:
        return cls(
            config["hidden_size"],
            config["intermediate_size"],
            config["num_hidden_layers"],
            config["num_attention_heads"],
            config.get("num_key_value_heads") or config["num_attention_heads"],
            config["vocab_size"],
            bool(config.get("tie_word_embeddings", False)),
            bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
        )


# Architectures of models the profiles name, for planning where their config cannot be read (no hub access).
KNOWN = {
    "tiny": Architecture(64, 128, 2, 4, 4, 262, True),
    "smollm2-135m": Architecture(576, 1536, 30, 9, 3, 49152, True),
    "Qwen/Qwen2.5-0.5B-Instruct": Architecture(896, 4864, 24, 14, 2, 151936, True, True),
    "Qwen/Qwen2.5-7B-Instruct": Architecture(3584, 18944, 28, 28, 4, 152064, False, True),
}


def architecture(spec: str) -> Architecture:
    """The architecture of a model spec (a built-in, a Hugging Face folder, a known hub id); ValueError otherwise."""
    folder = cache_dir() / "models" / spec if spec in BUILTINS else Path(spec).expanduser()
    if (folder / "config.json").is_file():
        return Architecture.from_config(json.loads((folder / "config.json").read_text()))
    if spec in KNOWN:
        return KNOWN[spec]
    raise ValueError(f"cannot plan memory for {spec!r}: no config.json there and not one of {', '.join(KNOWN)}")


@dataclass
class UpdatePlan:
    """One role's update, in bytes per device."""

    role: str
    parameters: int
    master: int
    gradients: int
    optimizer: int
    reference: int
    activations: int

    @property
    def total(self) -> int:
        return self.master + self.gradients + self.optimizer + self.reference + self.activations


@dataclass
class Plan:
    device: str  # cuda or cpu
    dtype: str  # what the models compute in
    devices: int
    memory_per_device: int  # bytes
    generation: dict[str, int]  # role -> bytes its generation copy (or vLLM reservation) holds per device
    vllm: bool  # generation is vLLM engines' reservations, not transformers copies
    updates: list[UpdatePlan] = field(default_factory=list)
    concurrent: bool = False  # async: the updates run at once (the sync loop makes one at a time)
    processes: int = 0  # processes on the device, each with its CUDA context (0 on the CPU)

    @property
    def peak(self) -> int:
        totals = [u.total for u in self.updates]
        updates = sum(totals) if self.concurrent else max(totals, default=0)
        return sum(self.generation.values()) + updates + self.processes * CUDA_CONTEXT

    @property
    def fits(self) -> bool:
        return self.peak <= self.memory_per_device

    def verdict(self) -> str:
        where = f"{self.devices} x {self.memory_per_device / GIB:.0f} GiB {self.device}"
        if self.fits:
            return f"fits: {self.peak / GIB:.1f} GiB of {self.memory_per_device / GIB:.0f} GiB per device ({where})"
        return (
            f"does not fit: needs {self.peak / GIB:.1f} GiB per device, {where} has "
            f"{self.memory_per_device / GIB:.0f} GiB (see `genenv plan`: LoRA, gradient checkpointing, bf16, "
            "fewer rows per micro-batch, or more devices with FSDP)"
        )

    def rows(self) -> list[tuple[str, str, float]]:
        """(role, what, GiB per device) for a table."""
        what = "vLLM reservation" if self.vllm else "generation"
        out = [(role, what, b / GIB) for role, b in self.generation.items()]
        for u in self.updates:
            for what in ("master", "gradients", "optimizer", "reference", "activations"):
                out.append((f"train {u.role}", what, getattr(u, what) / GIB))
        if self.processes:
            out.append((f"{self.processes} processes", "CUDA contexts", self.processes * CUDA_CONTEXT / GIB))
        return out


def update_plan(
    role: str, arch: Architecture, options, dtype: str, prompt_tokens: int, completion_tokens: int, shards: int
) -> UpdatePlan:
    n = arch.parameters
    lora = getattr(options, "use_peft", False)
    if lora:
        targets = len(getattr(options, "lora_target_modules", ())) or 4
        trained = arch.layers * targets * options.lora_r * 2 * arch.hidden  # A and B of each adapted projection
        master = n * BYTES[dtype] + trained * 4
    else:
        frozen = arch.vocab * arch.hidden if getattr(options, "freeze_embeddings", False) else 0
        trained = n - frozen
        master = n * 4 + (n * BYTES[dtype] if dtype != "fp32" else 0)
    uses_reference = bool(getattr(options, "beta", 0) or getattr(options, "kl_coef", 0))
    reference = n * BYTES[dtype] if uses_reference else 0
    # GRPO's ptx term is backpropagated apart from its own (trainers/grpo.py), so a micro-batch's activations are
    # the larger of the two terms' rows, each a whole prompt and answer
    ptx_rows = getattr(options, "ptx_batch_size", 0) if getattr(options, "ptx_coef", 0) else 0
    rows = max(options.per_device_train_batch_size, ptx_rows)
    tokens = rows * (prompt_tokens + completion_tokens)
    act_bytes = BYTES[dtype] / 2  # Korthikanti's figure is for 16-bit activations
    if getattr(options, "gradient_checkpointing", False):
        activations = tokens * arch.hidden * (2 * arch.layers + 34) * act_bytes
    else:
        activations = tokens * arch.hidden * 34 * arch.layers * act_bytes
    logits = rows * (completion_tokens + 1) * arch.vocab * 4 * 3
    return UpdatePlan(
        role,
        n,
        int(master / shards),
        int(trained * 4 / shards),
        int(trained * 8 / shards),
        int(reference),
        int(activations + logits),
    )


def plan_run(
    config,
    devices: int = 1,
    memory_gib: float | None = None,
    device: str | None = None,
    asynchronous: bool = False,
) -> Plan:
    """The memory plan of a RunConfig on `devices` devices of `memory_gib` each (default: this machine's: the
    first CUDA device's memory, or the CPU's RAM). A role whose trainer config sets `fsdp` is sharded over the
    devices; otherwise each device holds its model whole (DDP). device: "cuda" or
    "cpu" to plan for (default: where the config's device resolves on this machine); an "auto" dtype is then bf16
    on CUDA and fp32 on the CPU, as it would be there. asynchronous: the async mode's workers on one device, all
    at once (see the module's docstring)."""
    if device is None:
        device = "cuda" if config.precision.resolved().device.startswith("cuda") else "cpu"
    memory = _device_memory(device) if memory_gib is None else int(memory_gib * GIB)
    dtype = config.dtype if config.dtype != "auto" else ("bf16" if device == "cuda" else "fp32")
    roles = {"agent": (config.agent_model, config.agent, config.agent_max_new_tokens)}
    if config.mode != "seeds-only":
        roles["env"] = (config.env_model, config.env, config.env_max_new_tokens)

    def held(role: str) -> int:  # one copy of a role's model for generation
        if config.backend == "vllm":
            return int(config.gpu_memory_utilization * memory)
        if config.backend == "vllm-server":  # the server's GPUs are its own; here, the bf16 copy its weights go from
            return architecture(roles[role][0]).parameters * BYTES["bf16"]
        return architecture(roles[role][0]).parameters * BYTES[dtype]

    trained = [role for role in roles if role == "agent" or config.mode == "genenv"]
    if asynchronous:
        generation = {f"agent (rollout worker {i})": held("agent") for i in range(config.rollout_workers)}
        generation["agent (train-agent's validation)"] = held("agent")
        if "env" in roles:
            generation["env (simulator worker)"] = held("env")
    else:
        generation = {role: held(role) for role in roles}
    updates = [
        update_plan(
            role,
            architecture(roles[role][0]),
            roles[role][1],
            dtype,
            PROMPT_TOKENS,
            roles[role][2],
            devices if roles[role][1].fsdp else 1,
        )
        for role in trained
    ]
    # async on a GPU: each worker that holds a model is a process with its own CUDA context (the reward workers and
    # the ingestor hold none)
    processes = 0
    if asynchronous and device == "cuda":
        processes = config.rollout_workers + ("env" in roles) + len(trained)
    return Plan(device, dtype, devices, memory, generation, config.backend == "vllm", updates, asynchronous, processes)


def _device_memory(device: str) -> int:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory
    import psutil

    return psutil.virtual_memory().total
