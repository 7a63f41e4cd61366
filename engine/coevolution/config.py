"""The run's configuration: one dataclass tree, a TOML file, profiles, and `--set name=value` overrides.

    [run] keys at the top level (domain, mode, epochs, ...), then tables
    [curriculum]  alpha, beta, k, granularity, weight_temperature
    [agent]       GRPO options with TRL's names (learning_rate, beta, epsilon, loss_type, ...)
    [env]         RWR options (learning_rate, weight_temperature, kl_coef, ...)

Precedence: defaults < profile < config file < --set. Every value is checked before any work starts.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import tomli_w

from lake import Lake
from trainers import GRPOConfig, ModelNotFound, Precision, RWRConfig, check_model_spec, native_bf16, vllm_available
from trainers.plan import plan_run

from ..domains import DOMAINS, get_domain, multi_turn
from .curriculum import CurriculumConfig
from .overrides import OverrideError, apply_values, parse_pairs

Mode = Literal["genenv", "genenv-random", "genenv-static", "seeds-only"]  # docs/DESIGN.md, "Modes and the ablation"
MODES = get_args(Mode)
MAX_WORKERS = 64  # worker processes of one kind: each loads its own model


@dataclass
class RunConfig:
    domain: str = "toolcall"  # the domain where a measured CPU run shows learning (docs/RESULTS.md)
    mode: Mode = "genenv"
    # 4 epochs of 20 tasks took 13:32-14:06 on 2 cores of an AMD EPYC in bf16 (docs/RESULTS.md, e124, e127, e128);
    # more tasks an epoch give more mixed groups to train on than more epochs of fewer (20 gave 3-8 an epoch).
    # 0: until stopped (async runs only; SIGTERM or Ctrl-C stops them cleanly)
    epochs: int = 4
    tasks_per_epoch: int = 20  # valid tasks an epoch: the simulator writes until it has them (or its attempts end)
    batch_size: int = 4  # tasks per curriculum batch (granularity "batch")
    group_size: int = 8  # rollouts per task (G): with 8, most tasks the agent solves sometimes get a mixed group
    agent_model: str = "smollm2-135m"
    env_model: str = "smollm2-135m"
    seed: int = 0
    run_id: str = ""  # default: <domain>-<mode>-s<seed>-<time>
    # Sampling temperature of rollouts and task generations: variety within a group, but at 1.0 the 135M agent
    # miscopies values even in clean requests, so most groups of the simulator's tasks were all wrong
    # (docs/RESULTS.md, e18)
    temperature: float = 0.7
    # The simulator's own sampling temperature (0: the run's `temperature`). Its RWR updates score the generations
    # at it (`env.temperature` follows it, as `agent.temperature` follows `temperature`).
    simulator_temperature: float = 0.0
    agent_max_new_tokens: int = 72  # toolcall's hardest level: three calls, up to ~63 tokens
    env_max_new_tokens: int = 64  # a request that states every value of three calls
    generation_batch_size: int = 32
    # The share of a trained simulator's requests (genenv mode) whose choice is drawn uniformly instead of left to
    # the simulator (the domain's grammar admits only the drawn one): RWR is a weighted likelihood of the simulator's
    # own samples, so a choice it stops writing gets no weight again, and after one update it wrote one letter 10
    # times in 10 and stayed there when the band moved (docs/RESULTS.md). Domains that offer a choice (toolcall).
    simulator_explore: float = 0.0
    max_generation_attempts: int = 4  # rounds of simulator generation to reach tasks_per_epoch valid tasks
    # Dynamic sampling (DAPO; verl's filter_groups): up to this many rounds of new tasks an epoch in place of groups
    # whose rollouts all agree (no GRPO advantage), until tasks_per_epoch groups are mixed, or agent.max_groups where
    # that is set (the update trains no more). 0: none. A round costs about as much as the epoch's own rollouts and
    # gave about one mixed group (docs/RESULTS.md, e9), so the default spends that time on epochs instead.
    refill_rounds: int = 0
    # Guidance (LUFFY's off-policy guidance, arXiv 2504.14945): up to this many of an epoch's groups whose rollouts
    # all failed get the task's reference answer as one more rollout (rollout id `<task id>-guide`, scored by the
    # checker like any other), and the agent's update trains them before any other mixed group. GRPO learns nothing
    # from a task it never solves; the reference makes that group mixed. Its curriculum scores, the simulator's
    # history and the report's success are the agent's own rollouts only. The sync loop only: an async reward
    # worker holds no agent to take the reference's log-probabilities with. 0: none, the default: over seeds 0-2, 4
    # was ahead of it by +0.013 on the same items, and 2 given to the lowest levels first by +0.015, within one
    # seed's spread (docs/RESULTS.md, e162-e172).
    guidance: int = 0
    validation_size: int = 200  # held-out tasks scored greedily (in batches) before training and after the last epoch
    # After the other epochs' updates, only the first validation_subset of them (stratified by level like the whole
    # set: 2 per toolcall level for 16), with its interval in the report; 0 (or >= validation_size): the whole set.
    validation_subset: int = 16
    # After the last epoch: the agent on the first N items of BFCL's simple_python and of its multiple category
    # (bfcl-eval's data and checker, as `genenv eval` scores them), recorded in the lake's eval tables. 0: none.
    final_bfcl_items: int = 0
    warm_start: bool = True  # SFT both models on seed tasks before epoch 0 (docs/DESIGN.md)
    # On 2 CPU cores a 135M model trains at ~100 tokens/s: 24 seeds x 2 passes is about 80 s per model.
    warm_start_tasks: int = 24
    warm_start_epochs: int = 2
    warm_start_learning_rate: float = 1e-4
    seeds_path: str = ""  # toolcall: draw the seeds from API-Bank's level-1-api.json (e.g. data/api-bank)
    backend: Literal["transformers", "vllm", "vllm-server"] = "transformers"
    # backend vllm-server: each role's `vllm serve` (TRL's server mode: trainers/generation.py VLLMServerBackend)
    agent_vllm_server_base_url: str = "http://127.0.0.1:8000"
    env_vllm_server_base_url: str = "http://127.0.0.1:8001"
    device: str = "auto"  # where models live: auto (CUDA when present, else cpu), cpu, cuda, cuda:<n>
    # auto (bf16 on CUDA, fp32 on the CPU), fp32, bf16, fp16; trainers keep fp32 master weights. The default is bf16
    # on a CPU that multiplies bf16 in hardware (trainers.models.native_bf16: 1.5x faster runs, docs/RESULTS.md e19),
    # else auto; config.toml records which.
    dtype: str = field(default_factory=lambda: "bf16" if native_bf16() else "auto")
    tensor_parallel_size: int = 1  # vLLM: GPUs per engine
    gpu_memory_utilization: float = 0.4  # vLLM: each engine's share of a GPU (the sync loop holds two engines)
    max_model_len: int = 4096  # vLLM: the longest prompt and answer an engine serves (0: the model's whole context)
    rollout_workers: int = 1  # async: rollout worker processes (one consumer group shares the tasks)
    reward_workers: int = 1  # async: reward worker processes
    # async: a reward worker sends a task again (TaskReassigned records it) when its group is still incomplete this
    # long after the task came: a rollout worker then makes the rollouts the lake lacks. Kafka already moves a task
    # from a rollout worker that stops polling (max.poll.interval.ms, 300 s); this is for work lost on the way.
    reassign_after_s: float = 600.0
    # Task granularity: at 10-20 tasks an epoch a batch's p_hat rarely lands in the band, a task's often does. With
    # G = 8 a task's p_hat is a multiple of 0.125, and k = 0.25 keeps those solved 2 to 6 times in 8.
    curriculum: CurriculumConfig = field(default_factory=lambda: CurriculumConfig(granularity="task", k=0.25))
    # One step per mixed group (its 8 rollouts, their prompt encoded once), 2 passes, one AdamW carried across the
    # run's updates with a warmup of 8 steps; DAPO's clip-higher (epsilon_high) against the collapse of the variety
    # a group needs; and PPO-ptx on 2 of the warm start's answers a step, so that what no mixed group covers (the
    # multi-call answers) does not decay. At most 8 mixed groups an update (16 steps), every one of them at 20 tasks
    # an epoch: at each of seeds 0-4 this (with 4 ptx answers) gained more than the default before it (four steps
    # of 2 rows on each of at most 2 groups of 10 tasks), +0.09 against +0.04 on average (docs/RESULTS.md,
    # e114-e120 against e77-e81; 3 passes undid what 2 taught, e4). 2 ptx answers gained what 4 did over seeds 0-4
    # (+0.067 against +0.073 on average, a paired -0.006 [-0.068, +0.056]) in three quarters of the time: a ptx
    # answer is a whole prompt, most of a step's tokens (e123-e129). The embeddings (the tied output head) stay the
    # warm start's: their gradients and moments were 0.34 GB of the run's 4.3 GB peak.
    # Activations recomputed in the backward pass: a micro-batch's kept activations were 0.5 GB of a bf16 update's
    # peak, for about 10% more of its time (e62 of docs/RESULTS.md). Advantages are the reward minus the group's
    # mean, not divided by its std (Dr. GRPO's choice, TRL's scale_rewards "none"): divided, the one wrong answer of
    # a group that is 7 times in 8 right weighs -2.47, and those pushes took the agent off the easiest level; this
    # gained more than with the std at each of seeds 0-4 (e70-e74 against e64-e66, e75 and e76 of
    # docs/RESULTS.md).
    agent: GRPOConfig = field(
        default_factory=lambda: GRPOConfig(
            learning_rate=3e-5,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=1,
            num_iterations=2,
            lr_scheduler_type="constant_with_warmup",
            warmup_steps=8,
            temperature=0.7,
            epsilon_high=0.28,
            ptx_coef=0.3,
            ptx_batch_size=2,
            max_groups=8,
            scale_rewards="none",
            freeze_embeddings=True,
            gradient_checkpointing=True,
        )
    )
    # Steps of 8 generations in micro-batches of 2: the simulator's prompts are long (four candidates), and a
    # micro-batch's activations are what sets the run's peak memory (the warm start takes these options too; one
    # generation a micro-batch made its warm start 154 s against 120, e34). At
    # 10 tasks an epoch 0-3 are in band: every scored valid generation is trained on (band_only false), weighted at
    # T = 0.5, and an update waits for 16 rows (every other epoch), so that RWR's weights spread over more than one
    # or two generations. The activations of those long prompts are recomputed in the backward pass (in both
    # models' warm start too): with them kept, the simulator's updates were the run's largest moments (4.5-5.5 GB
    # in the process, docs/RESULTS.md "Time and memory"), for a second forward pass. The embeddings (the tied head)
    # stay as the warm start left them in these updates, as in the agent's: their gradients and moments (0.34 GB) put
    # the simulator's update over 4 GB in bf16 (4.38 GB in e62 of docs/RESULTS.md). The warm starts still train them
    # (`CoEvolution.warm_start` builds their options and does not pass this one).
    env: RWRConfig = field(
        default_factory=lambda: RWRConfig(
            learning_rate=1e-5,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=4,
            band_only=False,
            weight_temperature=0.5,
            min_rows=16,
            temperature=0.7,
            gradient_checkpointing=True,
            freeze_embeddings=True,
        )
    )

    def check(self) -> None:
        """Raise ValueError naming the first bad value."""
        if self.domain not in DOMAINS:
            raise ValueError(f"domain must be one of {', '.join(DOMAINS)}, got {self.domain!r}")
        if self.run_id:
            check_run_id(self.run_id)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0 (0: until stopped, async only), got {self.epochs}")
        for name in (
            "tasks_per_epoch",
            "batch_size",
            "group_size",
            "agent_max_new_tokens",
            "env_max_new_tokens",
            "generation_batch_size",
            "max_generation_attempts",
            "validation_size",
            "warm_start_tasks",
            "warm_start_epochs",
            "rollout_workers",
            "reward_workers",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("rollout_workers", "reward_workers"):
            if getattr(self, name) > MAX_WORKERS:
                raise ValueError(f"{name} must be at most {MAX_WORKERS} (each is a process with its own model)")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO compares rollouts within a group), got {self.group_size}")
        if self.seeds_path:
            _ = get_domain(self.domain, self.seeds_path).seed_file  # read now: raises naming what is missing
        if self.refill_rounds < 0:
            raise ValueError(f"refill_rounds must be >= 0, got {self.refill_rounds}")
        if self.guidance < 0:
            raise ValueError(f"guidance must be >= 0 (0: none), got {self.guidance}")
        if self.guidance and multi_turn(get_domain(self.domain)):
            raise ValueError(f"guidance is for single-turn domains, and {self.domain} is played over turns")
        if self.validation_subset < 0:
            raise ValueError(
                f"validation_subset must be >= 0 (0: the whole set every epoch), got {self.validation_subset}"
            )
        if self.final_bfcl_items < 0:
            raise ValueError(f"final_bfcl_items must be >= 0, got {self.final_bfcl_items}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.simulator_temperature < 0:
            raise ValueError(f"simulator_temperature must be >= 0 (0: temperature's), got {self.simulator_temperature}")
        if not 0 <= self.simulator_explore <= 1:
            raise ValueError(f"simulator_explore must be in [0, 1], got {self.simulator_explore}")
        if self.simulator_explore and not getattr(get_domain(self.domain, self.seeds_path), "choices", 0):
            raise ValueError(f"simulator_explore needs a domain whose simulator picks a choice; {self.domain} has none")
        if self.reassign_after_s <= 0:
            raise ValueError(f"reassign_after_s must be > 0 (seconds), got {self.reassign_after_s}")
        if self.backend not in ("transformers", "vllm", "vllm-server"):
            raise ValueError(f"backend must be transformers, vllm or vllm-server, got {self.backend!r}")
        self.precision.check()
        if self.tensor_parallel_size < 1 or not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("tensor_parallel_size must be >= 1 and gpu_memory_utilization in (0, 1]")
        longest = max(self.agent_max_new_tokens, self.env_max_new_tokens)
        if self.max_model_len and self.max_model_len <= longest:
            raise ValueError(
                f"max_model_len must exceed the longest answer ({longest} new tokens) by the prompt's length, "
                f"got {self.max_model_len} (0: the model's whole context)"
            )
        for section in ("curriculum", "agent", "env"):
            try:
                getattr(self, section).check()
            except ValueError as exc:
                raise ValueError(f"[{section}] {exc}") from None
        if self.agent.temperature != self.temperature:
            raise ValueError(
                "agent.temperature must equal temperature (the logprobs are recorded at the sampling temperature)"
            )
        if self.env.temperature != self.simulator_sampling_temperature:
            raise ValueError(
                "env.temperature must equal the simulator's sampling temperature (simulator_temperature, or "
                "temperature where that is 0): RWR scores the generations at the temperature they were drawn at"
            )

    @property
    def simulator_sampling_temperature(self) -> float:
        return self.simulator_temperature or self.temperature

    @property
    def precision(self) -> Precision:
        return Precision(self.device, self.dtype)


def check_machine(config: RunConfig) -> None:
    """What this machine must have for the run (ValueError naming what is missing), before any work starts: the
    device, and vLLM with CUDA where backend = vllm or vllm-server. `RunConfig.check` does not ask, so a config for
    another machine can still be read, printed and written."""
    try:
        config.precision.resolved()
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    for role, spec in (("agent_model", config.agent_model), ("env_model", config.env_model)):
        try:
            check_model_spec(spec)
        except ModelNotFound as exc:
            raise ValueError(f"{role}: {exc}") from None
    if config.final_bfcl_items:
        from ..benchmarks import DataMissing
        from ..benchmarks.bfcl import BFCL, FINAL_CATEGORIES

        try:
            BFCL(FINAL_CATEGORIES).load(None, 1)
        except DataMissing as exc:
            raise ValueError(f"final_bfcl_items: {exc}") from None
    if config.backend in ("vllm", "vllm-server"):  # the server's client pushes weights over NCCL, from CUDA
        ok, why = vllm_available()
        if not ok:
            raise ValueError(f"backend = {config.backend} cannot run here: {why}; use --set backend=transformers")


def check_async(config: RunConfig) -> None:
    """ValueError for an option the async mode cannot honour: `genenv run --async` and `genenv worker` both ask."""
    if config.guidance:
        raise ValueError("guidance is for the sync loop: an async reward worker holds no agent to score a reference")


def check_plan(config: RunConfig, asynchronous: bool = False) -> None:
    """ValueError when the run's memory plan (trainers/plan.py; the async mode's when asynchronous) cannot fit this
    machine's device; a run whose models the plan cannot size (a GGUF file, a hub id it does not know) is not
    stopped."""
    try:
        the_plan = plan_run(config, asynchronous=asynchronous)
    except ValueError:
        return
    if not the_plan.fits:
        raise ValueError(f"memory plan: {the_plan.verdict()}")


PROFILES: dict[str, dict] = {
    # tiny models, 2 epochs: the whole loop in about a minute on a laptop CPU (tests use it). A random tiny
    # model needs ~150 passes over 16 seeds before it writes parseable tasks.
    "quick": {
        "domain": "arith",
        "agent_model": "tiny",
        "env_model": "tiny",
        "epochs": 2,
        "tasks_per_epoch": 4,
        "batch_size": 2,
        "group_size": 4,
        "agent_max_new_tokens": 8,
        "env_max_new_tokens": 24,
        "validation_size": 6,
        "validation_subset": 3,
        "refill_rounds": 1,
        # a random tiny model's groups are almost all alike: keep them all, so every epoch has an update to test
        "agent.filter_groups": False,
        "agent.max_groups": 0,
        "agent.per_device_train_batch_size": 4,  # one step per group of 4 and pass: a few steps an update
        "warm_start_tasks": 16,
        "warm_start_epochs": 150,
        "warm_start_learning_rate": 5e-3,
        # a tiny model's 8 rows in one micro-batch: the warm start's 150 passes in a quarter of the forward passes
        "env.per_device_train_batch_size": 8,
        "env.gradient_accumulation_steps": 1,
        # an env update every epoch on what is in band, as the tests' runs check
        "env.band_only": True,
        "env.weight_temperature": 0.2,
        "env.min_rows": 1,
        "agent.learning_rate": 1e-3,
        "env.learning_rate": 1e-3,
        # what the tests' runs check was written for fp32 sampling at 1.0; a tiny model gains nothing from bf16
        "temperature": 1.0,
        "dtype": "fp32",
    },
    # smollm2-135m on CPU: the embedded default
    "default": {},  # see RunConfig's defaults
    # the paper's settings (Qwen2.5-7B-Instruct, batch 64, 8 rollouts, vLLM) for GPU machines
    # The plan (`genenv plan --profile paper`) fits one 141 GB GPU: two vLLM engines of 15% each, LoRA updates of a
    # bf16 base with gradient checkpointing, and the simulator's reference model for its KL term.
    # configs/paper-fsdp-8gpu.toml: an 8 x 80 GB FSDP variant with full fine-tuning.
    "paper": {
        "agent_model": "Qwen/Qwen2.5-7B-Instruct",
        "env_model": "Qwen/Qwen2.5-7B-Instruct",
        "epochs": 10,
        "tasks_per_epoch": 64,
        "batch_size": 64,
        "group_size": 8,
        "agent_max_new_tokens": 512,
        "env_max_new_tokens": 512,
        "validation_size": 200,
        "validation_subset": 0,
        "warm_start": False,
        "backend": "vllm",
        "gpu_memory_utilization": 0.15,
        "temperature": 1.0,
        "curriculum.granularity": "batch",
        "curriculum.k": 0.1,
        "env.band_only": True,  # the paper's filter: 64 tasks an epoch leave enough rows in band
        "env.weight_temperature": 0.2,
        "env.min_rows": 1,
        "generation_batch_size": 256,
        "agent.learning_rate": 1e-5,
        "env.learning_rate": 1e-5,
        "agent.per_device_train_batch_size": 8,
        "agent.gradient_accumulation_steps": 8,
        "agent.num_iterations": 1,
        "agent.max_groups": 0,  # 64 tasks an epoch: every mixed group
        "agent.use_peft": True,
        "env.use_peft": True,
        # the CPU default's saving, which FSDP (configs/paper-fsdp-8gpu.toml) refuses; LoRA trains no embedding anyway
        "agent.freeze_embeddings": False,
        "env.freeze_embeddings": False,
        "agent.gradient_checkpointing": True,
        "env.gradient_checkpointing": True,
    },
}


def _flatten(table: dict, prefix: str = "") -> list[tuple[str, object]]:
    """A TOML table as (name or section.name, value) items, values as TOML typed them."""
    items = []
    for key, value in table.items():
        if isinstance(value, dict):
            items += _flatten(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def override(config: RunConfig, items: list[tuple[str, object]], text: bool = False) -> RunConfig:
    """Apply (name or section.name, value) items: text as from `--set` (`text`), or values a TOML file typed."""
    top, sections = {}, {"curriculum": {}, "agent": {}, "env": {}}
    for name, value in items:
        section, dot, rest = name.partition(".")
        if dot and section in sections:
            sections[section][rest] = value
        elif dot:
            raise OverrideError(f"{name}: no section {section!r} (sections: {', '.join(sections)})")
        else:
            top[name] = value
    config = apply_values(config, top, text)
    changes = {}
    for section, values in sections.items():
        if values:
            try:
                changes[section] = apply_values(getattr(config, section), values, text)
            except OverrideError as exc:
                raise OverrideError(f"{section}.{exc}") from None
    named = {name.strip() for name in top}
    if "temperature" in named:  # the agent's logprob temperature follows
        changes["agent"] = dataclasses.replace(changes.get("agent", config.agent), temperature=config.temperature)
    if named & {"temperature", "simulator_temperature"}:  # and the simulator's
        sampled_at = config.simulator_sampling_temperature
        changes["env"] = dataclasses.replace(changes.get("env", config.env), temperature=sampled_at)
    return dataclasses.replace(config, **changes)


def load_config(profile: str = "default", path: Path | None = None, sets: list[str] = ()) -> RunConfig:
    """Defaults < profile < file < sets; raises ValueError (one line) on anything unknown or out of range."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    config = override(RunConfig(), list(PROFILES[profile].items()))
    if path is not None:
        if not path.is_file():
            raise ValueError(f"config file {path} does not exist")
        config = override(config, _flatten(read_toml(path.read_text(), f"config file {path}")))
    config = override(config, parse_pairs(list(sets)), text=True)
    config.check()
    return config


def read_toml(text: str, what: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{what} is not valid TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested tables and arrays recursively
        raise ValueError(f"{what} nests its tables or arrays too deeply to read") from None


def to_toml(config: RunConfig) -> str:
    """The full configuration as TOML (written into the report folder, and a template for users), by tomli-w, so
    every value reads back as it was (TOML has no null: an unset optional is "none", as on the command line)."""

    def plain(value):
        if value is None:
            return "none"
        return list(value) if isinstance(value, tuple) else value

    def table(obj) -> dict:
        return {
            f.name: table(v) if dataclasses.is_dataclass(v := getattr(obj, f.name)) else plain(v)
            for f in dataclasses.fields(obj)
        }

    return tomli_w.dumps(table(config))


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a run id names a file: <lake>/runs/<run id>.toml


def check_run_id(run_id: str) -> str:
    """`run_id` if it can name a file in <lake>/runs/; ValueError otherwise."""
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(
            f"run id {run_id!r:.80} must be 1-128 letters, digits, '.', '_' or '-', not starting with '.', '_' or '-'"
        )
    return run_id


def run_config_path(run_id: str) -> str:
    """Where a run's full configuration is kept in its lake (replay and audit read it back), relative to the root.
    Run ids in events are a producer's text: one that could not name a file there (a "/", "..") is refused, never
    followed."""
    return f"runs/{check_run_id(run_id)}.toml"


def record_run_config(lake: Lake, run_id: str, config: RunConfig) -> None:
    """Write the run's configuration once (a run's workers all call this; the first one writes it)."""
    lake.files.write_text_once(run_config_path(run_id), to_toml(config))


def recorded_run_config(lake: Lake, run_id: str) -> RunConfig:
    relative = run_config_path(run_id)
    text = lake.files.read_text(relative)
    if text is None:
        raise ValueError(
            f"run {run_id} has no recorded configuration at {lake.root}/{relative} (runs record it when they start)"
        )
    config = override(RunConfig(), _flatten(read_toml(text, f"{lake.root}/{relative}")))
    config.check()
    return config
