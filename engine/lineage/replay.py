"""Replay: rebuild one epoch of a run from the bronze log and retrain its checkpoints, bit for bit.

For every checkpoint the run registered in that epoch (the warm start's belong to epoch 0), oldest first:

    1. rebuild   the run's bronze records up to the watermark of the refine step that wrote the pool
                 version the update read (and the one its parent read) are refined into a scratch lake
    2. compare   the update's rows (pool rows the parent had not seen, of this run) in the scratch lake
                 against the source lake's: the first differing row or value is the answer if they differ
    3. retrain   from the recorded parent checkpoint (its hash checked), with the config and seed from the
                 checkpoint's genenv.json, on the rebuilt rows
    4. check     sha256 of the new weights against the registry; otherwise the first differing tensor

`rescore=True` also re-runs the domain's checker on the epoch's rollouts (as rebuilt) and recomputes every
batch's p_hat, R_env and filter decision with the run's curriculum options: the rows that would change,
for example after a checker fix. The source lake is only read; the scratch lake is a temporary folder
unless one is named.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl
from safetensors.torch import load_file

from lake import CHECKPOINTS, POOLS, CommitRecord, Lake, read_table, rebuild_to, record_at, silver, weight_files
from trainers import Precision, load_checkpoint, manifest
from trainers.checkpoints import checkpoint_dir, fetch_checkpoint, save_checkpoint
from trainers.update import (
    POOL_OF,
    ROW_KEY,
    anchor_run,
    config_from_manifest,
    fit,
    master_weights,
    new_rows,
    ptx_rows,
    reference_model,
    reference_version,
    select_update_rows,
    starting_optimizer,
)

from ..coevolution import CurriculumConfig, Phase, Say, no_phase, recorded_run_config, score_groups
from ..coevolution.roles import GUIDANCE
from ..domains import Domain, get_domain, task_from_row
from .audit import AuditError, latest_run


class ReplayError(RuntimeError):
    """An epoch that cannot be replayed (nothing registered, no recorded config): one line for the user."""


@dataclass
class ReplayedCheckpoint:
    kind: str
    version: int
    parent_version: int
    warm_start: bool
    pool_version: int  # what the update read in the source lake ...
    rebuilt_pool_version: int  # ... and the scratch lake's version with the same rows
    rows: int
    recorded_sha256: str
    replayed_sha256: str | None = None
    first_difference: str | None = None
    seconds: float = 0.0

    @property
    def matches(self) -> bool:
        return self.first_difference is None


@dataclass
class Change:
    table: str  # "reward" (one rollout) or "batch" (one curriculum group)
    row_id: str
    field: str
    recorded: object
    rescored: object


@dataclass
class ReplayResult:
    run_id: str
    epoch: int
    scratch: str | None  # kept scratch lake, None when it was a temporary folder
    checkpoints: list[ReplayedCheckpoint]
    rescored_rollouts: int = 0
    changes: list[Change] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.matches for c in self.checkpoints)


def replay_epoch(
    lake: Lake,
    epoch: int,
    run_id: str | None = None,
    scratch: Path | None = None,
    rescore: bool = False,
    domain: Domain | None = None,
    say: Say = print,
    phase: Phase | None = None,
) -> ReplayResult:
    """Replay one epoch (see the module's docstring). domain: the checker to rescore with (default: the run's)."""
    start = time.perf_counter()
    phase = phase or no_phase
    try:
        run_id = run_id or latest_run(lake)
    except AuditError as exc:
        raise ReplayError(str(exc)) from None
    registered = read_table(lake, CHECKPOINTS).unique(["model_kind", "version"], keep="first")
    mine = registered.filter((pl.col("run_id") == run_id) & (pl.col("epoch") == epoch)).sort("produced_at")
    if mine.is_empty():
        epochs = sorted(set(read_table(lake, silver("task")).filter(pl.col("run_id") == run_id)["epoch"].to_list()))
        if epoch not in epochs:
            raise ReplayError(
                f"run {run_id!r} has no epoch {epoch} in {lake.root} (epochs: {', '.join(map(str, epochs)) or 'none'})"
            )
        say(f"run {run_id} registered no checkpoints in epoch {epoch} (every update was skipped): nothing to retrain")
    if rescore and domain is None:
        try:
            config = recorded_run_config(lake, run_id)
        except ValueError as exc:
            raise ReplayError(f"cannot rescore: {exc}") from None
        domain = get_domain(config.domain, config.seeds_path)
    pool_of_parent = {(r["model_kind"], r["version"]): r["pool_version"] for r in registered.iter_rows(named=True)}

    keep = scratch is not None
    root = Path(scratch) if keep else Path(tempfile.mkdtemp(prefix="genenv-replay-"))
    if keep and root.exists() and any(root.iterdir()):
        raise ReplayError(f"scratch lake {root} is not empty: name a new folder")
    try:
        rebuilt = Lake(root)
        plans = []
        for c in mine.iter_rows(named=True):
            pool = POOLS[POOL_OF[c["model_kind"]]]
            parent = c["parent_version"] or 0
            seen = pool_of_parent.get((c["model_kind"], parent)) if parent else None
            plans.append(
                Update(
                    c,
                    pool,
                    parent,
                    seen,
                    record_at(lake, pool, c["pool_version"]),
                    record_at(lake, pool, seen) if seen is not None else None,
                )
            )

        # Rebuild step by step, oldest watermark first, remembering the scratch lake's versions after each.
        records = [r for plan in plans for r in (plan.read, plan.parent_read) if r is not None]
        steps = sorted({r.seq: r for r in records}.values(), key=lambda r: r.seq)
        if rescore and not plans:  # nothing to retrain: rebuild the whole log to rescore the epoch
            steps = [CommitRecord.read(lake)]
        after: dict[int, CommitRecord] = {}
        with phase(f"rebuilding silver and gold from bronze ({len(steps)} refine watermarks)") as tick:
            for i, record in enumerate(steps):
                after[record.seq] = rebuild_to(lake, rebuilt, record.watermark, run_id)
                tick(i + 1, len(steps))

        replayed = [_retrain(lake, rebuilt, run_id, plan, after, phase) for plan in plans]
        for r in replayed:
            say(f"{r.kind} v{r.version}: " + ("sha256 matches" if r.matches else f"DIFFERS: {r.first_difference}"))
        result = ReplayResult(run_id, epoch, str(root) if keep else None, replayed)
        if rescore:
            result.rescored_rollouts, result.changes = rescore_epoch(
                rebuilt, run_id, epoch, domain, recorded_curriculum(lake, run_id)
            )
        result.seconds = round(time.perf_counter() - start, 2)
        return result
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


@dataclass
class Update:
    """One registered update to redo: its registry row, the pool it read, its parent and what the parent read."""

    row: dict
    pool: str
    parent: int
    seen: int | None  # the pool version the parent was trained on (None: the parent is the base model)
    read: CommitRecord  # the refine step that wrote the pool version the update read ...
    parent_read: CommitRecord | None  # ... and the one that wrote the parent's


def _retrain(
    lake: Lake, rebuilt: Lake, run_id: str, plan: Update, after: dict[int, CommitRecord], phase: Phase
) -> ReplayedCheckpoint:
    c = plan.row
    start = time.perf_counter()
    kind, pool_name = c["model_kind"], POOL_OF[c["model_kind"]]
    lineage = manifest(lake, kind, c["version"])
    config, warm_start = config_from_manifest(kind, lineage)
    version_then = after[plan.read.seq].versions.get(plan.pool, 0)
    seen_then = after[plan.parent_read.seq].versions.get(plan.pool, 0) if plan.parent_read else None
    of_run = pl.col("run_id") == run_id
    rows = new_rows(rebuilt, pool_name, version_then, seen_then).filter(of_run)
    out = ReplayedCheckpoint(
        kind, c["version"], plan.parent, warm_start, c["pool_version"], version_then, rows.height, c["sha256"]
    )
    recorded_rows = new_rows(lake, pool_name, c["pool_version"], plan.seen).filter(of_run)
    out.first_difference = first_row_difference(recorded_rows, rows, ROW_KEY[pool_name])
    processes = lineage.get("metrics", {}).get("processes", 1)
    if out.first_difference is None and processes > 1:
        out.first_difference = (
            f"it was trained in {processes} processes (gradients reduced across ranks); a replay "
            "retrains in one, which agrees to float precision, not bit for bit"
        )
    if out.first_difference is None:
        selected, dropped = select_update_rows(kind, rows, plan.parent, config, warm_start)
        # The precision the update ran in (checkpoints from before it was recorded ran in fp32 on the CPU).
        precision = Precision(**lineage.get("precision", {"device": "cpu", "dtype": "fp32"}))
        loaded = load_checkpoint(lake, kind, plan.parent, lineage["base_model"], master_weights(precision, config))
        state = starting_optimizer(lake, kind, plan.parent, config, warm_start)  # the parent's, as the update had it
        with phase(f"retraining {kind} v{c['version']} on {selected.height} rows") as tick:
            reference = lineage.get("reference_version", reference_version(lake, kind, plan.parent))
            ref = reference_model(lake, kind, reference, lineage["base_model"], config, precision)
            anchor = ptx_rows(
                rebuilt, kind, config, version_then, anchor_run(lake, kind, reference, run_id), warm_start
            )
            model, _, _ = fit(
                loaded, selected, dropped, config, ref, warm_start, tick, precision, state=state, anchor=anchor
            )
        folder = checkpoint_dir(rebuilt, kind, c["version"])
        out.replayed_sha256 = save_checkpoint(model, loaded.tokenizer, folder, {**lineage, "path": str(folder)})
        if out.replayed_sha256 != c["sha256"]:
            out.first_difference = (
                f"sha256 {out.replayed_sha256[:12]}... != recorded {c['sha256'][:12]}...; "
                + first_tensor_difference(fetch_checkpoint(lake, kind, c["version"], c["sha256"]), folder)
            )
    out.seconds = round(time.perf_counter() - start, 2)
    return out


def first_row_difference(recorded: pl.DataFrame, rebuilt: pl.DataFrame, key: str) -> str | None:
    """The first row or value (by key order) where two pools' rows differ; None when they are equal."""
    missing = recorded.join(rebuilt, on=key, how="anti").sort(key)
    if missing.height:
        return f"row {key}={missing[key][0]} is in the lake's pool but not in the rebuilt one ({missing.height} rows)"
    extra = rebuilt.join(recorded, on=key, how="anti").sort(key)
    if extra.height:
        return f"row {key}={extra[key][0]} is in the rebuilt pool but not in the lake's ({extra.height} rows)"
    a, b = recorded.sort(key), rebuilt.sort(key).select(recorded.columns)
    for x, y in zip(a.iter_rows(named=True), b.iter_rows(named=True)):
        for column in a.columns:
            if x[column] != y[column]:
                lake_value, rebuilt_value = str(x[column])[:60], str(y[column])[:60]
                return f"row {key}={x[key]}: {column} is {lake_value!r} in the lake, {rebuilt_value!r} rebuilt"
    return None


def first_tensor_difference(recorded: Path, replayed: Path) -> str:
    """The first tensor (by name) in which two checkpoint folders' weights (one file or shards) differ."""
    if not weight_files(recorded):
        return f"the recorded weights in {recorded} are missing"
    a = {k: v for f in weight_files(recorded) for k, v in load_file(str(f)).items()}
    b = {k: v for f in weight_files(replayed) for k, v in load_file(str(f)).items()}
    if a.keys() != b.keys():
        return f"tensor names differ: {sorted(a.keys() ^ b.keys())[:3]}"
    for name in sorted(a):
        if a[name].shape != b[name].shape:
            return f"tensor {name}: shape {tuple(a[name].shape)} recorded, {tuple(b[name].shape)} replayed"
        if not a[name].equal(b[name]):
            diff = (a[name].float() - b[name].float()).abs()
            differing = int((diff > 0).sum())
            return f"first differing tensor {name}: {differing} values differ, max |diff| {diff.max().item():.3g}"
    return "the tensors are equal; the files differ in their metadata"


# -- rescoring -----------------------------------------------------------------------------------------
def recorded_curriculum(lake: Lake, run_id: str) -> CurriculumConfig:
    try:
        return recorded_run_config(lake, run_id).curriculum
    except ValueError as exc:
        raise ReplayError(f"cannot rescore: {exc}") from None


def rescore_epoch(
    lake: Lake, run_id: str, epoch: int, domain: Domain, curriculum: CurriculumConfig
) -> tuple[int, list[Change]]:
    """Check the epoch's rollouts again and recompute its batches: (rollouts rescored, the values that change)."""

    def of_epoch(kind: str) -> pl.DataFrame:
        frame = read_table(lake, silver(kind))
        return frame.filter(
            (pl.col("run_id") == run_id) & (pl.col("epoch") == epoch) & (pl.col("producer") != "warm-start")
        )

    tasks = {t["task_id"]: t for t in of_epoch("task").iter_rows(named=True)}
    rewards = {r["rollout_id"]: r for r in of_epoch("reward").iter_rows(named=True)}
    changes: list[Change] = []
    successes: dict[str, list[bool]] = {}
    rollouts = of_epoch("rollout").sort("rollout_id")
    for r in rollouts.iter_rows(named=True):
        task, recorded = tasks.get(r["task_id"]), rewards.get(r["rollout_id"])
        if task is None or recorded is None:
            continue
        verdict = domain.check(task_from_row(task), r["completion"])
        if r["producer"] != GUIDANCE:  # a group's score is of the agent's own rollouts (RunConfig.guidance)
            successes.setdefault(r["task_id"], []).append(verdict.success)
        for name, new in (("reward", verdict.reward), ("success", verdict.success)):
            if new != recorded[name]:
                changes.append(Change("reward", r["rollout_id"], name, recorded[name], new))
    batch_level = replace(curriculum, granularity="batch")  # score each recorded group as one group
    for b in of_epoch("batch").sort("batch_id").iter_rows(named=True):
        members = {t: successes.get(t, []) for t in b["task_ids"]}
        (score,) = score_groups(b["batch_id"], members, batch_level) or (None,)
        if score is None:
            continue
        for name, new in (("p_hat", score.p_hat), ("env_reward", score.env_reward), ("filtered", score.filtered)):
            if abs(float(new) - float(b[name])) > 1e-9:
                changes.append(Change("batch", b["batch_id"], name, b[name], new))
    return rollouts.height, changes
