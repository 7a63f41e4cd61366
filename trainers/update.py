"""One update of a model from its pool: resolve lineage, read the new rows, train, write a checkpoint.

    agent: gold/d_train --GRPO--> checkpoints/agent/v<n>
    env:   gold/d_env   --RWR-->  checkpoints/env/v<n>
    a warm start: either pool's seed rows --SFT (TRL's SFTTrainer, trainers/sft.py)--> the next version

An update trains the parent (default: the newest registered version; version 0 is the base model)
on the pool rows at `pool_version` that the parent has not seen: those absent from the pool at the
version the parent was trained on. Everything that can be wrong (pool version, parent, base model,
options, an empty selection) is checked before a model is loaded, and nothing is written unless
training finished. Publishing the CheckpointPublished event is the caller's job (trainers do not
talk to Kafka); the registry row appears when the event is ingested.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections import Counter
from dataclasses import asdict

import polars as pl
import torch

from lake import POOLS, Lake, checkpoint_path, read_pool, rows_appended, weights_digest

from . import distributed, grpo, rwr
from .checkpoints import (
    KINDS,
    CheckpointRecord,
    checkpoint_dir,
    config_hash,
    latest_version,
    load_checkpoint,
    load_optimizer_state,
    manifest,
    publish_files,
    registered,
    reserve_version,
    save_checkpoint,
)
from .grpo import turns_of
from .loop import OptimizerState, Progress, merged
from .models import CPU, LoadedModel, Precision
from .sft import train_sft

POOL_OF = {"agent": "d_train", "env": "d_env"}
SEED_VERSION = "seed"  # the model version stamped on seed tasks and reference answers (the warm-start data)
ROW_KEY = {"d_train": "rollout_id", "d_env": "task_id"}


class TrainError(RuntimeError):
    """An update that cannot start: nothing to train on, or options that contradict the lineage."""


def default_config(kind: str):
    return grpo.GRPOConfig() if kind == "agent" else rwr.RWRConfig()


def new_rows(lake: Lake, pool: str, version: int, seen_version: int | None) -> pl.DataFrame:
    """Rows of the pool at `version` that were not in it at `seen_version`."""
    if seen_version is None:
        return read_pool(lake, pool, version)
    appended = rows_appended(lake, POOLS[pool], seen_version, version)  # what is new alone, from the change feed
    if appended is not None:
        return appended
    seen = read_pool(lake, pool, seen_version).select(ROW_KEY[pool])
    return read_pool(lake, pool, version).join(seen, on=ROW_KEY[pool], how="anti")


def warm_start_rows(kind: str, rows: pl.DataFrame) -> pl.DataFrame:
    """The seed rows of a pool (version "seed") as (prompt, text, env_reward): reference answers or seed task texts."""
    if kind == "agent":
        rows = rows.filter(pl.col("agent_model_version") == SEED_VERSION).sort("rollout_id")
        # A multi-turn row trains as its turns, one pair a turn; one whose turns cannot be read (None) is left out,
        # as GRPO leaves it out, not trained as a single answer.
        each = turns_of(rows)
        pairs = [(t["prompt"], str(t.get("completion", ""))) for turns in each for t in turns or []]
        single = rows.select(pl.col("prompt"), pl.col("completion").alias("text"))
        single = single.filter(pl.Series([turns == [] for turns in each], dtype=pl.Boolean))
        turned = pl.DataFrame(pairs, schema={"prompt": pl.String, "text": pl.String}, orient="row")
        return pl.concat([single, turned]).with_columns(pl.lit(1.0).alias("env_reward"))
    rows = rows.filter(pl.col("env_model_version") == SEED_VERSION).sort("task_id")
    return rows.select(
        pl.col("sim_prompt").alias("prompt"), pl.col("raw_generation").alias("text"), pl.lit(1.0).alias("env_reward")
    )


def ptx_rows(
    lake: Lake, kind: str, config, pool_version: int, run_id: str | None, warm_start: bool
) -> pl.DataFrame | None:
    """The rows of GRPO's ptx term (`GRPOConfig.ptx_coef`): the warm start's reference answers in d_train at
    `pool_version` (run `run_id`'s, when one is named: `anchor_run`), as `warm_start_rows` gives them; None when
    there is no such term."""
    if kind != "agent" or warm_start or not getattr(config, "ptx_coef", 0):
        return None
    rows = read_pool(lake, POOL_OF[kind], pool_version)
    if run_id is not None:
        rows = rows.filter(pl.col("run_id") == run_id)
    return warm_start_rows(kind, rows)


def anchor_run(lake: Lake, kind: str, reference: int, run_id: str | None) -> str | None:
    """The run whose seed rows are an update's ptx anchor: the one that made the warm start it descends from
    (checkpoint `reference`, `reference_version`), whichever run the update is part of. An ablation's other modes
    continue the first mode's warm start, and with their own run's rows they had no ptx term at all
    (docs/RESULTS.md, the ablation of the e30 default). `run_id` without a warm start in the lineage."""
    return registered(lake, kind, reference)["run_id"] if reference > 0 else run_id


def train_update(
    kind: str,
    lake: Lake,
    config=None,
    *,
    base_model: str | None = None,
    pool_version: int | None = None,
    parent_version: int | None = None,
    run_id: str | None = None,
    warm_start: bool = False,
    precision: Precision = Precision(),
    progress: Progress | None = None,
) -> CheckpointRecord:
    """One update (see the module's docstring). warm_start: supervised fine-tuning on the pool's seed rows
    (the version "seed") through TRL's SFTTrainer (trainers/sft.py), with an RWRConfig's options, instead of GRPO /
    RWR.
    run_id: train on that run's rows only (the engine's runs share a lake). precision: the device, and the dtype
    the update computes in (recorded in the lineage, so a replay uses it too); the checkpoint holds fp32 weights.
    The optimiser continues the parent update's (optimizer.pt beside the parent: trainers/checkpoints.py); see
    `starting_optimizer` for when it starts afresh."""
    config, precision = checked_options(kind, config, precision)
    table = POOLS[POOL_OF[kind]]
    pool_version = lake.version(table) if pool_version is None else pool_version
    lake.table(table, pool_version)  # raises LakeError naming the latest version when it does not exist
    parent = latest_version(lake, kind) if parent_version is None else parent_version
    base_model, seen_version = parent_lineage(lake, kind, parent, base_model, pool_version)
    selected, dropped = update_rows(lake, kind, config, parent, pool_version, seen_version, run_id, warm_start)
    reference = reference_version(lake, kind, parent)
    anchor = ptx_rows(lake, kind, config, pool_version, anchor_run(lake, kind, reference, run_id), warm_start)
    group, precision, fsdp = processes(config, precision)

    # The parent, verified against its sha256; where its optimiser stands; the KL term's reference.
    loaded = load_checkpoint(lake, kind, parent, base_model, master_weights(precision, config))
    state = starting_optimizer(lake, kind, parent, config, warm_start, fsdp)
    # The reference is passed, not kept: the trainer drops it once its log-probabilities are computed.
    model, metrics, weights = fit(
        loaded,
        selected,
        dropped,
        config,
        reference_model(lake, kind, reference, base_model, config, precision),
        warm_start,
        progress,
        precision,
        group,
        state,
        anchor,
    )

    # The child: the next version, saved whole with its lineage and optimiser state, its files published.
    version = 0
    if group is None or group.is_main_process:
        owner = json.dumps({"run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(), "at": time.time()})
        version = reserve_version(lake, kind, max(parent, latest_version(lake, kind)), owner)
    if group is not None:
        from accelerate.utils import broadcast_object_list

        version = broadcast_object_list([version])[0]  # the version rank 0 reserved
        metrics["processes"] = group.num_processes
    record = CheckpointRecord(
        model_kind=kind,
        version=version,
        parent_version=parent,
        base_model=base_model,
        path=checkpoint_path(kind, version),
        sha256="",
        pool_table=table,
        pool_version=pool_version,
        config_hash=config_hash(config),
        seed=config.seed,
        metrics=metrics,
    )
    lineage = {
        **asdict(record),
        "config": asdict(config),
        "precision": asdict(precision),
        "reference_version": reference,
    }
    lineage.pop("sha256")
    target = checkpoint_dir(lake, kind, version)
    if group is None or group.is_main_process:
        saved = None if warm_start else state  # a warm start's optimiser is another objective's: never continued
        record.sha256 = save_checkpoint(model, loaded.tokenizer, target, lineage, state_dict=weights, optimizer=saved)
        publish_files(lake, kind, version)
    if group is not None:
        group.wait_for_everyone()  # the other ranks read rank 0's file, never write one
        record.sha256 = weights_digest(target)
    return record


def checked_options(kind: str, config, precision: Precision):
    """The update's config (the kind's default when None) and resolved precision, or a TrainError naming what is
    wrong with them."""
    if kind not in KINDS:
        raise TrainError(f"unknown model kind {kind!r}; kinds: {', '.join(KINDS)}")
    config = config or default_config(kind)
    try:
        config.check()
        return config, precision.resolved()
    except ValueError as exc:
        raise TrainError(f"bad {kind} training option: {exc}") from None


def parent_lineage(
    lake: Lake, kind: str, parent: int, base_model: str | None, pool_version: int
) -> tuple[str, int | None]:
    """(the base model the parent descends from, the pool version it was trained on: None for the base model),
    or a TrainError when the request contradicts the lineage."""
    table = POOLS[POOL_OF[kind]]
    if parent == 0:
        if base_model is None:
            raise TrainError(f"no {kind} checkpoint is registered yet: name the base model to start from")
        return base_model, None
    lineage = manifest(lake, kind, parent)
    if base_model is not None and base_model != lineage["base_model"]:
        raise TrainError(f"{kind} v{parent} descends from {lineage['base_model']!r}, not {base_model!r}")
    seen_version = lineage["pool_version"]
    if seen_version > pool_version:
        raise TrainError(
            f"{kind} v{parent} was trained on {table}@{seen_version}, newer than the requested {pool_version}"
        )
    return lineage["base_model"], seen_version


def update_rows(
    lake: Lake,
    kind: str,
    config,
    parent: int,
    pool_version: int,
    seen_version: int | None,
    run_id: str | None,
    warm_start: bool,
) -> tuple[pl.DataFrame, Counter]:
    """The rows the update trains on (new since the parent's pool version, of the run when one is named) and the
    others counted by why; a TrainError when none is left."""
    pool = POOL_OF[kind]
    rows = new_rows(lake, pool, pool_version, seen_version)
    if run_id is not None:
        rows = rows.filter(pl.col("run_id") == run_id)
    selected, dropped = select_update_rows(kind, rows, parent, config, warm_start)
    if selected.is_empty():
        table = POOLS[pool]
        since = f" since {table}@{seen_version} (what v{parent} saw)" if seen_version is not None else ""
        why = f"; left out: {dict(dropped)}" if dropped else ""
        raise TrainError(f"{table}@{pool_version} holds no rows to train the {kind} on{since}{why}")
    return selected, dropped


def processes(config, precision: Precision):
    """(the Accelerator of a multi-process update or None, this rank's precision, the FSDP mode or "")."""
    fsdp = getattr(config, "fsdp", "") if distributed.world_size() > 1 else ""
    try:
        distributed.check_sharding(fsdp, precision.device)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    group = distributed.accelerator(cpu=precision.device == "cpu", fsdp=fsdp, dtype=precision.resolved().torch_dtype)
    if group is not None:
        device = "cpu" if group.device.type == "cpu" else str(group.device)  # each rank on its own device
        precision = Precision(device, precision.dtype)
    return group, precision, fsdp


def select_update_rows(
    kind: str, rows: pl.DataFrame, parent: int, config, warm_start: bool
) -> tuple[pl.DataFrame, Counter]:
    """The rows an update trains on, in training order, and the others counted by why they were left out."""
    expected = rwr.RWRConfig if warm_start or kind == "env" else grpo.GRPOConfig
    if not isinstance(config, expected):
        raise TrainError(f"{'a warm start' if warm_start else kind} training takes a {expected.__name__}")
    if warm_start:
        return warm_start_rows(kind, rows), Counter()
    if kind == "agent":
        return grpo.select_rows(rows, parent, config)
    selected, dropped = rwr.select_rows(rows, config)
    if 0 < selected.height < config.min_rows:
        raise TrainError(
            f"{selected.height} new rows to train the env on, fewer than min_rows {config.min_rows}: "
            "they wait in the pool for the next update"
        )
    return selected, dropped


def starting_optimizer(lake: Lake, kind: str, parent: int, config, warm_start: bool, fsdp: str = "") -> OptimizerState:
    """Where an update's optimiser starts: the parent update's saved state, or a fresh AdamW at step 0 for a warm
    start, after the base model or a warm start, with LoRA (each update trains new adapters) or FSDP (a sharded
    state is not the whole model's)."""
    if warm_start or getattr(config, "use_peft", False) or fsdp:
        return OptimizerState()
    return load_optimizer_state(lake, kind, parent) or OptimizerState()


def reference_version(lake: Lake, kind: str, parent: int) -> int:
    """The model a KL term (GRPO's beta, RWR's kl_coef) holds an update near: the newest warm start among the parent's
    ancestors (the parent included), else the base model (version 0). Not the base model after a warm start: for
    the agent that is a model that cannot call tools yet, and a pull towards it undoes what the warm start taught."""
    if parent == 0:
        return 0
    lineage = manifest(lake, kind, parent)
    if lineage.get("metrics", {}).get("warm_start"):
        return parent
    if "reference_version" in lineage:  # what the parent's own update was held near (recorded in its genenv.json)
        return lineage["reference_version"]
    return reference_version(lake, kind, lineage["parent_version"])  # a checkpoint from before it was recorded


def reference_model(lake: Lake, kind: str, version: int, base_model: str, config, precision: Precision):
    """The KL term's reference model, checkpoint `version` (`reference_version`), in eval mode; None when the config
    has no KL term."""
    if not (getattr(config, "beta", 0) or getattr(config, "kl_coef", 0)):
        return None
    return load_checkpoint(lake, kind, version, base_model, precision.resolved()).model.eval()


def master_weights(precision: Precision, config) -> Precision:
    """How a trainer holds the parent's weights: fp32 (so fp32 gradients and optimiser state) whatever it computes
    in; with LoRA the frozen base stays in the compute dtype and only the adapters (fp32, as peft makes them) train."""
    precision = precision.resolved()
    return precision if getattr(config, "use_peft", False) else Precision(precision.device, "fp32")


def fit(
    loaded: LoadedModel,
    selected: pl.DataFrame,
    dropped: Counter,
    config,
    ref,
    warm_start: bool,
    progress: Progress | None = None,
    precision: Precision = CPU,
    group=None,
    state: OptimizerState | None = None,
    anchor: pl.DataFrame | None = None,
) -> tuple[torch.nn.Module, dict, dict | None]:
    """Train the parent model (loaded with fp32 master weights) on the selected rows: (the trained model, LoRA
    merged, in fp32 whatever the compute dtype; its metrics; with several processes, its whole weights as gathered
    for rank 0 to write, else None). Forward passes run under autocast when the dtype is not fp32 (mixed precision).
    ref: the KL term's reference model (`reference_model`), or None. group: the Accelerator of a multi-process update
    (trainers/distributed.py). state: where the optimiser starts,
    left holding where it ended. Deterministic on CPU for the same parent, optimiser state, rows, config, seed,
    precision and number of processes: replay relies on it."""
    precision = precision.resolved()
    dtype = precision.torch_dtype
    device_type = precision.torch_device.type

    # autocast's cache of 16-bit weight copies off: they live until the context ends, a second copy of the weights
    # (0.22 GB of a 135M model's update) beside what the backward keeps; casting again each forward was no slower.
    def compute():
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=dtype, cache_enabled=False)

    torch.manual_seed(config.seed)
    state = state if state is not None else OptimizerState()
    continued = state.optimizer is not None
    if warm_start:  # supervised fine-tuning: TRL's SFTTrainer (trainers/sft.py), in one process
        if group is not None:
            raise TrainError("a warm start trains in one process; run it without --num-processes")
        metrics = train_sft(loaded.model, loaded.tokenizer, selected, config, precision, progress)
        return merged(loaded.model.float()), _finished(metrics, dropped, warm_start, continued), None
    if isinstance(config, grpo.GRPOConfig):
        trainer = grpo.GRPOTrainer(loaded.model, loaded.tokenizer, config, ref, compute, group, anchor=anchor)
    else:
        trainer = rwr.RWRTrainer(loaded.model, loaded.tokenizer, config, ref, compute, group)
    del ref  # the trainer's is the last reference, dropped once it is used (`Trainer.train`)
    metrics = trainer.train(selected, progress, state)
    tail = (
        distributed.left_out(selected.height, config.per_device_train_batch_size, group.num_processes) if group else 0
    )
    if tail:
        dropped["uneven_tail"] += tail
    metrics = _finished(metrics, dropped, warm_start, continued)
    # The checkpoint of record is what was trained, in fp32: a bf16 file rounds away every change smaller than half
    # its spacing (most of a small update's), and the next update would start from the rounded model. LoRA: the
    # frozen base is cast up (exactly) before the adapters are merged, so their product is not rounded either.
    if group is None or getattr(config, "use_peft", False):  # LoRA: each rank holds the whole model to merge into
        return merged(trainer.model.float()), metrics, None
    # Every rank takes part in the gather (under FSDP each holds a shard); rank 0 receives the whole weights.
    weights = {name: tensor.float() for name, tensor in group.get_state_dict(trainer.model).items()}
    return group.unwrap_model(trainer.model).float(), metrics, weights


def _finished(metrics: dict, dropped: Counter, warm_start: bool, continued: bool) -> dict:
    """An update's metrics as its lineage records them: where its optimiser started, the rows left out and why."""
    metrics["optimizer"] = (
        f"continued at step {metrics['lineage_steps'] - metrics['optimizer_steps']}" if continued else "fresh"
    )
    metrics["rows_left_out"] = dict(dropped)
    metrics["warm_start"] = warm_start
    return _plain(metrics)


def config_from_manifest(kind: str, lineage: dict):
    """The trainer config a checkpoint was written with (its genenv.json), as the dataclass it came from."""
    warm_start = lineage.get("metrics", {}).get("warm_start", False)
    cls = rwr.RWRConfig if warm_start or kind == "env" else grpo.GRPOConfig
    defaults = cls()
    values = {k: tuple(v) if isinstance(getattr(defaults, k, None), tuple) else v for k, v in lineage["config"].items()}
    return cls(**values), warm_start


def inherited_config(lake: Lake, kind: str, parent: int):
    """(the trainer options of the nearest update in the parent's lineage, the parent included, and its version),
    or (the defaults, None) when the lineage has no update but warm starts. A manual update (`genenv train`) so
    continues the run it extends: the temperature its rollouts were sampled at, LoRA, gradient checkpointing,
    the schedule; --set changes what it names."""
    version = parent
    while version > 0:
        lineage = manifest(lake, kind, version)
        config, warm_start = config_from_manifest(kind, lineage)
        if not warm_start:
            return config, version
        version = lineage["parent_version"]
    return default_config(kind), None


def _plain(metrics: dict) -> dict:
    """Metrics as JSON-safe numbers (rounded: they are for reading, the weights carry the exact result)."""
    return json.loads(json.dumps(metrics, default=float), parse_float=lambda s: round(float(s), 6))
