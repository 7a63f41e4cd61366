"""Audit: where any task or model version came from and what it caused, read from the lake alone.

    audit_task(lake, task_id)             the task's whole life: generation, validation, rollouts, rewards,
                                          its batch's curriculum score, the pool versions and checkpoints it fed
    audit_checkpoint(lake, kind, version) parents back to the base model, the pool rows each update trained on
    audit_epoch(lake, epoch, run_id)      what one epoch of a run generated, scored, quarantined and trained

Every answer is a plain dict (the CLI prints it, `--json` dumps it, the web view renders it). Lookups by
task id filter scans of the Delta tables (`pl.scan_delta(...).filter(...)`), so Polars prunes files and row
groups by their task_id statistics instead of reading whole tables; a pool version is found from the refine
steps' commit records (the step whose watermark first covers a row's source events), not by reading old
versions of the pool.
"""

from __future__ import annotations

from dataclasses import asdict

import polars as pl

from lake import CHECKPOINTS, D_ENV, D_TRAIN, POOLS, QUARANTINE, CommitRecord, Lake, late_only, silver
from streams import payload_of
from trainers import KINDS, CheckpointError, config_from_manifest, manifest, registry
from trainers.rwr import select_rows as select_generations
from trainers.update import POOL_OF, SEED_VERSION, new_rows, select_update_rows, warm_start_rows

from ..coevolution.roles import AGENTS_OWN
from .fields import json_object, json_or_text, nan_to_none, share_in_band, turns_in
from .measures import curriculum_measures


class AuditError(LookupError):
    """An unknown task, run, epoch or version: one line for the user."""


def scan(lake: Lake, table: str) -> pl.LazyFrame:
    return lake.scan(table)


def reassignments(lake: Lake, which: pl.Expr) -> pl.DataFrame:
    """The TaskReassigned rows that `which` selects (none in a lake written before that kind existed)."""
    table = silver("reassign")
    return scan(lake, table).filter(which).collect() if lake.exists(table) else pl.DataFrame()


def latest_run(lake: Lake) -> str:
    """The run whose newest task event is the newest in the lake."""
    newest = scan(lake, silver("task")).sort("kafka_timestamp").select(pl.col("run_id").last()).collect()
    if newest.is_empty() or newest.item() is None:
        raise AuditError(f"no runs in {lake.root} (silver/task is empty)")
    return newest.item()


def runs(lake: Lake) -> list[dict]:
    """Every run in the lake with its size, newest first."""
    tasks = (
        scan(lake, silver("task"))
        .group_by("run_id")
        .agg(
            pl.col("domain").first(),
            pl.len().alias("tasks"),
            pl.col("valid").sum().alias("valid"),
            (pl.col("epoch").max() + 1).alias("epochs"),
            pl.col("kafka_timestamp").max().alias("last_event_ms"),
        )
    )
    checkpoints = scan(lake, CHECKPOINTS).group_by("run_id").agg(pl.len().alias("checkpoints"))
    frame = tasks.join(checkpoints, on="run_id", how="left").with_columns(pl.col("checkpoints").fill_null(0))
    return frame.sort("last_event_ms", descending=True).collect().to_dicts()


# -- tasks ---------------------------------------------------------------------------------------------
def _covered(record: CommitRecord, topic: str, row: dict) -> bool:
    parts = record.watermark.get(topic, {}).get(row["kafka_cluster"], {})
    return parts.get(row["kafka_partition"], -1) >= row["kafka_offset"]


def _first_version(history: list[CommitRecord], table: str, sources: list[tuple[str, dict]]) -> int | None:
    """The version of `table` written by the first refine step that had refined every source event."""
    for record in history:
        if all(_covered(record, topic, row) for topic, row in sources):
            return record.versions.get(table)
    return None


def audit_task(lake: Lake, task_id: str) -> dict:
    task = scan(lake, silver("task")).filter(pl.col("task_id") == task_id).collect()
    quarantined = (
        scan(lake, QUARANTINE)
        .filter(pl.col("task_id") == task_id)
        .select("topic", "kind", "event_id", "reason", "failed_checks")
        .collect()
        .to_dicts()
    )
    if task.is_empty():
        if quarantined:
            return {"task_id": task_id, "task": None, "quarantined": quarantined}
        raise AuditError(f"no task {task_id!r} in {lake.root} (neither silver/task nor the quarantine holds it)")
    t = task.row(0, named=True)
    run_id, epoch = t["run_id"], t["epoch"]

    rollouts = scan(lake, silver("rollout")).filter(pl.col("task_id") == task_id).collect()
    rewards = scan(lake, silver("reward")).filter(pl.col("task_id") == task_id).collect()
    joined = rollouts.join(
        rewards.select(
            "rollout_id",
            "reward",
            "success",
            "checker_detail",
            pl.col("kafka_cluster").alias("r_cluster"),
            pl.col("kafka_partition").alias("r_partition"),
            pl.col("kafka_offset").alias("r_offset"),
        ),
        on="rollout_id",
        how="left",
    )
    batch = (
        scan(lake, silver("batch"))
        .filter((pl.col("run_id") == run_id) & (pl.col("epoch") == epoch))
        .filter(pl.col("task_ids").list.contains(task_id))
        .collect()
    )

    history = CommitRecord.history(lake)
    task_source = ("genenv.tasks", t)
    pools = []
    if batch.height:
        b = batch.row(0, named=True)
        version = _first_version(history, D_ENV, [task_source, ("genenv.batches", b)])
        if version is not None:
            pools.append({"pool": D_ENV, "first_version": version, "rows": 1})
    train_versions = []
    for r in joined.filter(pl.col("reward").is_not_null()).iter_rows(named=True):
        reward_source = {
            "kafka_cluster": r["r_cluster"],
            "kafka_partition": r["r_partition"],
            "kafka_offset": r["r_offset"],
        }
        train_versions.append(
            _first_version(history, D_TRAIN, [("genenv.rollouts", r), ("genenv.rewards", reward_source)])
        )
    train_versions = [v for v in train_versions if v is not None]
    if train_versions:
        pools.append(
            {
                "pool": D_TRAIN,
                "first_version": min(train_versions),
                "last_version": max(train_versions),
                "rows": len(train_versions),
            }
        )

    return {
        "task_id": task_id,
        "run_id": run_id,
        "epoch": epoch,
        "domain": t["domain"],
        "batch_id": t["batch_id"],
        "simulator_version": t["env_model_version"],
        "producer": t["producer"],
        "simulator_prompt": t["sim_prompt"],
        "raw_generation": t["raw_generation"],
        "valid": t["valid"],
        "invalid_reason": t["invalid_reason"],
        "task_prompt": t["task_prompt"],
        "reference": json_or_text(t["reference_json"]),
        "difficulty": json_or_text(t["difficulty_json"]),
        "rollouts": [
            {
                "rollout_id": r["rollout_id"],
                "group_index": r["group_index"],
                "agent_version": r["agent_model_version"],
                "completion": r["completion"],
                "reward": r["reward"],
                "success": r["success"],
                "checker_detail": r["checker_detail"],
                # a multi-turn rollout's turns: the reply, the command it was taken as, what the agent then saw
                "turns": [
                    {"reply": t.get("completion"), "command": t.get("command"), "observation": t.get("observation")}
                    for t in turns_in(r.get("turns_json"))
                ],
            }
            for r in joined.sort("group_index").iter_rows(named=True)
        ],
        "batch": [
            {
                k: b[k]
                for k in (
                    "batch_id",
                    "granularity",
                    "p_hat",
                    "env_reward",
                    "weight",
                    "filtered",
                    "n_tasks",
                    "n_rollouts",
                    "n_success",
                )
            }
            for b in batch.iter_rows(named=True)
        ],
        "pools": pools,
        "checkpoints": _checkpoints_fed(lake, run_id, pools, task_id),
        "reassignments": [
            {k: r[k] for k in ("reassignment", "producer", "held_s", "rollouts_missing")}
            for r in sorted(
                reassignments(lake, pl.col("task_id") == task_id).iter_rows(named=True), key=lambda r: r["reassignment"]
            )
        ],
        "quarantined": quarantined,
    }


def _checkpoints_fed(lake: Lake, run_id: str, pools: list[dict], task_id: str) -> list[dict]:
    """The updates whose new rows included the task's rows: the parent had not seen them, its pool version had."""
    out = []
    registered = scan(lake, CHECKPOINTS).filter(pl.col("run_id") == run_id).collect()
    seen_by = {(r["model_kind"], r["version"]): r["pool_version"] for r in registered.iter_rows(named=True)}
    env_row = scan(lake, D_ENV).filter(pl.col("task_id") == task_id).collect()
    for pool in pools:
        kind = "env" if pool["pool"] == D_ENV else "agent"
        first = pool["first_version"]
        for c in registered.filter(pl.col("model_kind") == kind).sort("version").iter_rows(named=True):
            seen = seen_by.get((kind, c["parent_version"]), -1) if c["parent_version"] else -1
            if seen < first <= c["pool_version"]:
                out.append(
                    {
                        "kind": kind,
                        "version": c["version"],
                        "epoch": c["epoch"],
                        "pool_table": c["pool_table"],
                        "pool_version": c["pool_version"],
                        "sha256": c["sha256"],
                        "use": _env_use(lake, c["version"], env_row)
                        if kind == "env"
                        else _agent_use(lake, c, seen if seen >= 0 else None, task_id),
                    }
                )
    return out


LEFT_OUT = {
    "invalid": "invalid",
    "filtered": "filtered: outside the alpha band",
    "other_temperature": "sampled at another temperature than the update scored at",
    "zero_std_group": "its rollouts' rewards all agree",
    "over_max_groups": "more mixed groups than max_groups; others spread more",
    "unreadable_turns": "its turns cannot be trained on",
    "unknown_version": "made by an agent version that is not a number",
    "newer_than_parent": "made by a newer agent than the update started from",
    "stale": "made by an agent older than max_staleness or off_policy allow",
    "no_token_logprobs": "no token log-probabilities recorded",
}


def _left_out(dropped) -> str:
    return f"left out ({', '.join(LEFT_OUT.get(why, why) for why in dropped)})"


def _agent_use(lake: Lake, checkpoint: dict, seen: int | None, task_id: str) -> str:
    """Whether agent update `checkpoint` trained on the task's rollouts: the selection that update made (its new rows
    of its run, GRPO's `select_rows` with the options its lineage recorded), as `genenv replay` makes it again."""
    version = checkpoint["version"]
    try:
        config, warm_start = config_from_manifest("agent", manifest(lake, "agent", version))
    except CheckpointError as exc:
        return f"unknown ({exc})"
    rows = new_rows(lake, "d_train", checkpoint["pool_version"], seen).filter(pl.col("run_id") == checkpoint["run_id"])
    task_rows = rows.filter(pl.col("task_id") == task_id)
    if warm_start:
        trained = (task_rows["agent_model_version"] == SEED_VERSION).any()
        return "trained on" if trained else "left out (a warm start trains on the seed tasks' reference answers)"
    parent = checkpoint["parent_version"] or 0
    kept, dropped = select_update_rows("agent", task_rows, parent, config, warm_start)
    if kept.is_empty():
        return _left_out(dropped)
    kept, _ = select_update_rows("agent", rows, parent, config, warm_start)
    trained = kept.filter(pl.col("task_id") == task_id).height
    return f"trained on ({trained} of its rollouts)" if trained else _left_out(["over_max_groups"])


def _env_use(lake: Lake, version: int, row: pl.DataFrame) -> str:
    """Whether simulator update `version` trained on the task's d_env row: the selection that update made, with the
    options its lineage recorded (the default trains on rows outside the band too, `band_only` false); unknown where
    the checkpoint's files, and its options with them, are gone (`genenv lake prune`)."""
    try:
        config, warm_start = config_from_manifest("env", manifest(lake, "env", version))
    except CheckpointError as exc:
        return f"unknown ({exc})"
    if warm_start:
        return "trained on" if warm_start_rows("env", row).height else "left out (a warm start trains on seed tasks)"
    kept, dropped = select_generations(row, config)
    return "trained on" if kept.height else _left_out(dropped)


# -- checkpoints ---------------------------------------------------------------------------------------
def audit_checkpoint(lake: Lake, kind: str, version: int) -> dict:
    if kind not in KINDS:
        raise AuditError(f"unknown model kind {kind!r}; kinds: {', '.join(KINDS)}")
    rows = {r["version"]: r for r in registry(lake, kind).iter_rows(named=True)}
    if version not in rows:
        raise AuditError(
            f"no {kind} checkpoint version {version} in {lake.root}/{CHECKPOINTS} "
            f"(registered: {', '.join(map(str, sorted(rows))) or 'none'})"
        )
    try:
        base_model = manifest(lake, kind, version)["base_model"]
    except CheckpointError as exc:
        base_model = f"unknown ({exc})"
    chain, v = [], version
    while v:
        row = rows.get(v)
        if row is None:
            chain.append({"version": v, "missing": f"version {v} is not registered"})
            break
        parent = row["parent_version"] or 0
        seen = rows[parent]["pool_version"] if parent and parent in rows else None
        trained = new_rows(lake, POOL_OF[kind], row["pool_version"], seen).filter(pl.col("run_id") == row["run_id"])
        metrics = json_object(row["metrics_json"])
        key = "rollout_id" if kind == "agent" else "task_id"
        by_epoch = trained.group_by("epoch").agg(
            pl.col(key).n_unique().alias("rows"), pl.col("task_id").n_unique().alias("tasks")
        )
        chain.append(
            {
                "version": v,
                "parent_version": parent,
                "run_id": row["run_id"],
                "epoch": row["epoch"],
                "pool_table": row["pool_table"],
                "pool_version": row["pool_version"],
                "parent_pool_version": seen,
                "warm_start": bool(metrics.get("warm_start")),
                "sha256": row["sha256"],
                "config_hash": row["config_hash"],
                "seed": row["seed"],
                "path": row["path"],
                "new_rows_by_epoch": sorted(by_epoch.to_dicts(), key=lambda d: d["epoch"]),
                "seed_rows": int(
                    (trained[f"{'agent' if kind == 'agent' else 'env'}_model_version"] == SEED_VERSION).sum()
                )
                if trained.height
                else 0,
                "metrics": metrics,
            }
        )
        v = parent
    return {"kind": kind, "version": version, "base_model": base_model, "pool": POOLS[POOL_OF[kind]], "lineage": chain}


# -- epochs --------------------------------------------------------------------------------------------
def audit_epoch(lake: Lake, epoch: int, run_id: str | None = None) -> dict:
    run_id = run_id or latest_run(lake)
    of_epoch = (pl.col("run_id") == run_id) & (pl.col("epoch") == epoch)
    tasks = scan(lake, silver("task")).filter(of_epoch).collect()
    if tasks.is_empty():
        known = scan(lake, silver("task")).filter(pl.col("run_id") == run_id).select(pl.col("epoch").unique()).collect()
        if known.is_empty():
            raise AuditError(f"no run {run_id!r} in {lake.root}")
        raise AuditError(f"run {run_id} has no epoch {epoch} (epochs: {', '.join(map(str, sorted(known['epoch'])))})")
    generated = tasks.filter(pl.col("producer") != "warm-start")
    rewards = scan(lake, silver("reward")).filter(of_epoch & AGENTS_OWN).collect()
    batches = scan(lake, silver("batch")).filter(of_epoch & (pl.col("producer") != "warm-start")).collect()
    in_band = share_in_band(batches)
    checkpoints = scan(lake, CHECKPOINTS).filter(of_epoch).collect().sort("produced_at")
    invalid = generated.filter(~pl.col("valid"))
    return {
        "run_id": run_id,
        "epoch": epoch,
        "tasks_generated": generated.height,
        "seed_tasks": tasks.height - generated.height,
        "valid_share": round(generated["valid"].mean(), 4) if generated.height else None,
        "invalid_by_reason": _counts(invalid["invalid_reason"].to_list()),
        "quarantine_by_reason": quarantine_of(lake, run_id, epoch, set(tasks["task_id"])),
        "late_readmitted": late_readmitted(lake, set(tasks["task_id"])),
        "rollouts_scored": rewards.height,
        "agent_success_rate": round(rewards["success"].mean(), 4) if rewards.height else None,
        "batches": batches.height,
        "share_in_band": None if in_band is None else round(in_band, 4),
        **{name: nan_to_none(value) for name, value in asdict(curriculum_measures(generated, rewards)).items()},
        "checkpoints": [
            {
                "kind": c["model_kind"],
                "version": c["version"],
                "parent_version": c["parent_version"],
                "pool_version": c["pool_version"],
                "sha256": c["sha256"],
                "warm_start": bool(json_object(c["metrics_json"]).get("warm_start")),
            }
            for c in checkpoints.iter_rows(named=True)
        ],
        "worker_restarts": [
            {"worker": r["worker"], "role": r["role"], "exit_code": r["exit_code"], "restart": r["restart"]}
            for r in scan(lake, silver("restart")).filter(of_epoch).collect().sort("produced_at").iter_rows(named=True)
        ],
        "tasks_reassigned": len({r["task_id"] for r in reassignments(lake, of_epoch).iter_rows(named=True)}),
    }


def quarantine_of(lake: Lake, run_id: str, epoch: int, task_ids: set[str]) -> dict[str, int]:
    """Quarantined records of one run's epoch by the first check they failed. A record belongs to the epoch
    when its task does or its raw payload names the run and epoch (a record that is not JSON names neither)."""
    rows = scan(lake, QUARANTINE).select("task_id", "failed_checks", "raw").collect()
    reasons = []
    for row in rows.iter_rows(named=True):
        mine = row["task_id"] in task_ids
        if not mine and row["raw"]:
            payload = payload_of(row["raw"]) or {}
            mine = payload.get("run_id") == run_id and type(payload.get("epoch")) is int and payload["epoch"] == epoch
        if mine:
            reasons.append(row["failed_checks"][0] if row["failed_checks"] else "unknown")
    return _counts(reasons)


def late_readmitted(lake: Lake, task_ids: set[str]) -> int:
    """Rollouts and rewards of these tasks quarantined as late (lake.late_only) that landed in silver since, when
    their task did: counted in quarantine_by_reason too, where their lateness stays on record."""
    late = (
        scan(lake, QUARANTINE)
        .filter(late_only() & pl.col("task_id").is_in(task_ids))
        .select("kind", "event_id")
        .collect()
    )
    landed = 0
    for kind in ("rollout", "reward"):
        ids = late.filter(pl.col("kind") == kind).select("event_id")
        if ids.height:
            landed += scan(lake, silver(kind)).select("event_id").join(ids.lazy(), on="event_id").collect().height
    return landed


def _counts(values: list) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[str(v)] = counts.get(str(v), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
