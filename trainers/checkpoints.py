"""Checkpoints: whole model folders under the lake root, addressed by (kind, version), checked by sha256.

    <lake>/checkpoints/<kind>/v<version>/
        model.safetensors, config.json, tokenizer files   a folder transformers loads as it is
        genenv.json                                        the lineage: parent, base model, pool + version, config, seed
        optimizer.pt                                       the AdamW state and lineage step the update ended with

Invariants:
- A checkpoint folder appears whole or not at all: it is written beside its final name, then renamed.
- Its sha256 is that of its weights: model.safetensors, or the manifest of its shards when they exceed
  SHARD_SIZE (lake/registry.py); its event names it by the lake-relative path. On CPU the same parent, pool
  version, config and seed give the same bytes, so the hash identifies the training, not only the file.
- The record of a checkpoint is its row in registry/checkpoints (from its CheckpointPublished event,
  through ingest, which registers one row per (kind, version) and only for files that exist with that
  hash); loading by version looks the row up and refuses a file whose hash differs.
- A checkpoint is found by (lake, kind, version), not by the absolute path its row records, so a lake
  that is copied or moved with its checkpoints/ folder stays whole.
- On an s3:// lake a checkpoint is written to the local cache, uploaded weights last, then published; loading
  fetches it into the cache unless the cache holds weights with the registered hash (lake/storage.py).
- Version 0 of each kind is the base model itself, named in every checkpoint's lineage; it has no folder.
- An update's optimiser state is saved beside its weights (optimizer.pt, its sha256 in genenv.json), so the next
  update, a replay of it, a resumed run and a restarted trainer all continue the same optimiser from the lake.
  Warm starts (SFT, another objective) save none: the first update after one starts a fresh optimiser.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl
import torch

from lake import (
    CHECKPOINTS,
    Lake,
    StorageError,
    checkpoint_path,
    claim_path,
    file_sha256,
    read_table,
    weights_refusal,
    write_weights_manifest,
)

from .loop import OptimizerState
from .models import CPU, LoadedModel, Precision, load_model

KINDS = ("agent", "env")
MANIFEST = "genenv.json"
OPTIMIZER = "optimizer.pt"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unregistered or does not match its recorded hash."""


@dataclass
class CheckpointRecord:
    """Everything a CheckpointPublished event says about a checkpoint (the engine adds run and epoch)."""

    model_kind: str
    version: int
    parent_version: int | None
    base_model: str
    path: str  # relative to the lake root: checkpoints/<kind>/v<version>
    sha256: str
    pool_table: str
    pool_version: int
    config_hash: str
    seed: int
    metrics: dict = field(default_factory=dict)

    def event_fields(self) -> dict:
        fields = asdict(self)
        fields.pop("base_model")
        fields["metrics_json"] = json.dumps(fields.pop("metrics"), sort_keys=True)
        return fields


def checkpoint_dir(lake: Lake, kind: str, version: int) -> Path:
    """Where a checkpoint folder is on this machine: in the lake, or in the local cache of a remote lake (where it
    is written before `publish_files` uploads it, and fetched to by `fetch_checkpoint`)."""
    return lake.files.local(checkpoint_path(kind, version))


def publish_files(lake: Lake, kind: str, version: int) -> None:
    """Upload a checkpoint written to checkpoint_dir to a remote lake, weights last (nothing on a local lake)."""
    lake.files.upload_folder(checkpoint_path(kind, version))


def fetch_checkpoint(lake: Lake, kind: str, version: int, sha256: str) -> Path:
    """checkpoint_dir, holding the lake's copy of the checkpoint (downloaded from a remote lake unless the cache
    already has weights with `sha256`)."""
    try:
        return lake.files.fetch_folder(
            checkpoint_path(kind, version), lambda cached: weights_refusal(cached, sha256) is None
        )
    except StorageError as exc:
        raise CheckpointError(f"{kind} checkpoint version {version}: {exc}") from None


def config_hash(config) -> str:
    return hashlib.sha256(json.dumps(asdict(config), sort_keys=True, default=str).encode()).hexdigest()[:16]


SHARD_SIZE = "2GB"  # weights above it are written as shards with a manifest (lake/registry.py)


LOW_DISK_BYTES = 64 * 2**20  # less than this free after a failed write: the disk is what failed


def save_checkpoint(
    model,
    tokenizer,
    target: Path,
    manifest: dict,
    max_shard_size: str = SHARD_SIZE,
    state_dict: dict | None = None,
    optimizer: OptimizerState | None = None,
) -> str:
    """Write model (in its dtype; or `state_dict`, the weights a multi-process update gathered), tokenizer,
    the optimiser state the update ended with (when given) and lineage to `target` (whole or not at all); return
    the weights' sha256 (of the one file, or of the shards' manifest)."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        model.save_pretrained(partial, safe_serialization=True, max_shard_size=max_shard_size, state_dict=state_dict)
        tokenizer.save_pretrained(partial)
        if optimizer is not None and optimizer.optimizer is not None:
            torch.save({"optimizer": optimizer.optimizer, "step": optimizer.step}, partial / OPTIMIZER)
            manifest = {
                **manifest,
                "optimizer_sha256": file_sha256(partial / OPTIMIZER),
                "optimizer_step": optimizer.step,
            }
        sha = write_weights_manifest(partial)
        (partial / MANIFEST).write_text(json.dumps({**manifest, "sha256": sha}, indent=2, sort_keys=True))
    except Exception as exc:  # torch's, safetensors' and the tokenizer's writers each raise their own kind
        # torch.save on a full disk says only "unexpected pos N vs M": ask the file system, and say what it is.
        shutil.rmtree(partial, ignore_errors=True)
        if shutil.disk_usage(partial.parent).free < LOW_DISK_BYTES:
            raise OSError(errno.ENOSPC, f"No space left on device writing checkpoint {target}") from exc
        raise
    # A folder left by a run that died before publishing is not a checkpoint of record: replace it.
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return sha


def registry(lake: Lake, kind: str) -> pl.DataFrame:
    """The registered checkpoints of one kind, one row per version, oldest first (the ingest registers the first
    event that proves its files and quarantines later ones for the same version; lakes from before kept both)."""
    if kind not in KINDS:
        raise CheckpointError(f"unknown model kind {kind!r}; kinds: {', '.join(KINDS)}")
    rows = read_table(lake, CHECKPOINTS).filter(pl.col("model_kind") == kind)
    return rows.unique("version", keep="first", maintain_order=True).sort("version")


def latest_version(lake: Lake, kind: str) -> int:
    """The newest registered version of a kind; 0 (the base model) when none is registered."""
    versions = registry(lake, kind)["version"]
    return int(versions.max()) if len(versions) else 0


def reserve_version(lake: Lake, kind: str, after: int, owner: str) -> int:
    """The first checkpoint version of `kind` above `after` that no other update has claimed, claimed for `owner`
    (lake/registry.py `claim_path`, a file created only if absent: lake/storage.py `claim`).
    Two runs or workers training one kind on one lake at once so never take one number, where the newest
    registered version + 1 gave both the same folder and one update overwrote the other's. A claim whose update
    died leaves a gap in the numbers, never a reused one."""
    version = after + 1
    while not lake.files.claim(claim_path(kind, version), owner):
        version += 1
    return version


def registered(lake: Lake, kind: str, version: int) -> dict:
    rows = registry(lake, kind).filter(pl.col("version") == version)
    if rows.is_empty():
        known = registry(lake, kind)["version"].to_list()
        raise CheckpointError(
            f"no {kind} checkpoint version {version} in {lake.root}/{CHECKPOINTS} "
            f"(registered: {', '.join(map(str, known)) or 'none'})"
        )
    return rows.row(0, named=True)


def manifest(lake: Lake, kind: str, version: int) -> dict:
    """The lineage a registered checkpoint was written with."""
    registered(lake, kind, version)
    relative = f"{checkpoint_path(kind, version)}/{MANIFEST}"
    try:
        text = lake.files.read_text(relative)
    except StorageError as exc:
        raise CheckpointError(f"{kind} checkpoint version {version}: {exc}") from None
    if text is None:
        raise CheckpointError(f"{kind} checkpoint version {version} has no {MANIFEST} at {lake.root}/{relative}")
    return json.loads(text)


def load_checkpoint(
    lake: Lake, kind: str, version: int, base_model: str | None = None, precision: Precision = CPU
) -> LoadedModel:
    """Load a registered checkpoint after checking its hash; version 0 is `base_model`."""
    if version == 0:
        if base_model is None:
            raise CheckpointError(f"{kind} version 0 is the base model, and none was named")
        return load_model(base_model, dtype=precision.torch_dtype, device=precision.torch_device)
    row = registered(lake, kind, version)
    return load_verified(
        fetch_checkpoint(lake, kind, version, row["sha256"]),
        row["sha256"],
        f"{kind} checkpoint version {version}",
        precision,
    )


def load_optimizer_state(lake: Lake, kind: str, version: int) -> OptimizerState | None:
    """The optimiser state the update that wrote checkpoint `version` ended with, checked against the hash its
    lineage records; None for the base model and for checkpoints saved without one (warm starts)."""
    if version == 0:
        return None
    expected = manifest(lake, kind, version).get("optimizer_sha256")
    if not expected:
        return None
    path = fetch_checkpoint(lake, kind, version, registered(lake, kind, version)["sha256"]) / OPTIMIZER
    if not path.is_file() or file_sha256(path) != expected:
        raise CheckpointError(
            f"{kind} checkpoint version {version}: {OPTIMIZER} is missing or does not match its "
            "recorded sha256 (corrupt or replaced)"
        )
    saved = torch.load(path, map_location="cpu", weights_only=True)  # tensors and numbers only: never unpickles code
    return OptimizerState(saved["optimizer"], int(saved["step"]))


def load_published(lake: Lake, kind: str, version: int, sha256: str, precision: Precision = CPU) -> LoadedModel:
    """Load the checkpoint a CheckpointPublished names, found by (kind, version) in the lake, never by the path the
    event carries (an event read straight from Kafka has not been through the registry's checks)."""
    return load_verified(
        fetch_checkpoint(lake, kind, version, sha256), sha256, f"{kind} checkpoint version {version}", precision
    )


def load_verified(path: str | Path, sha256: str, what: str = "checkpoint", precision: Precision = CPU) -> LoadedModel:
    """Load a checkpoint folder after checking its weights against `sha256` (as a CheckpointPublished carries it)."""
    if not Path(path).is_dir():
        raise CheckpointError(
            f"{what}: {path} is not in the lake (deleted by `genenv lake prune`, or the lake was "
            "copied without its checkpoints/); its lineage stays in the registry"
        )
    refusal = weights_refusal(Path(path), sha256)
    if refusal is not None:
        raise CheckpointError(f"{what}: {refusal} (corrupt or replaced)")
    return load_model(str(path), dtype=precision.torch_dtype, device=precision.torch_device)
