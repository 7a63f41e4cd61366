"""Where checkpoints live in a lake, and which CheckpointPublished events may enter its registry.

    <lake>/checkpoints/<kind>/v<version>/model.safetensors (and config, tokenizer, genenv.json)
    <lake>/checkpoints/<kind>/v<version>/model-0000i-of-0000n.safetensors + weights.sha256   (sharded)

A checkpoint's sha256 (the one its event carries and the registry records) is that of its weights: of
model.safetensors when the weights are one file; of the manifest `weights.sha256` when they are shards
(one line per shard, "<sha256>  <file>", as `sha256sum` writes and `sha256sum -c` checks). `weights_refusal`
checks either against it and names the file that differs.

Invariants:
- A CheckpointPublished names its checkpoint by the lake-relative path `checkpoints/<kind>/v<version>`,
  never by an absolute path: a copied or moved lake stays whole, and no event can point outside it.
- registry/checkpoints takes an event only if that folder exists inside the lake, its weights' sha256
  is the one the event carries, and no earlier event registered the same (kind, version). Anything else
  goes to the quarantine with the reason (`registry_refusal` names it), so the registry holds one row
  per (kind, version), the first that proved its files.

What a producer on an unauthenticated broker can still do is in docs/EVENTS.md ("Trust").
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .storage import LakeFiles

CHECKPOINTS_DIR = "checkpoints"
WEIGHTS = "model.safetensors"
WEIGHTS_MANIFEST = "weights.sha256"  # the shards' sha256s, in sha256sum's format


def checkpoint_path(kind: str, version: int) -> str:
    """A checkpoint's folder, relative to the lake root."""
    return f"{CHECKPOINTS_DIR}/{kind}/v{version}"


def claim_path(kind: str, version: int) -> str:
    """The file that reserves a checkpoint version for one update (trainers/checkpoints.py `reserve_version`),
    relative to the lake root: apart from the checkpoint folders, which hold only versions."""
    return f"{CHECKPOINTS_DIR}/.claims/{kind}/v{version}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, by name."""
    return sorted(Path(folder).glob("*.safetensors"))


def write_weights_manifest(folder: Path) -> str:
    """The checkpoint's sha256: of its one weights file, or of the manifest written here for its shards."""
    folder = Path(folder)
    files = weight_files(folder)
    if [f.name for f in files] == [WEIGHTS]:
        return file_sha256(folder / WEIGHTS)
    manifest = folder / WEIGHTS_MANIFEST
    manifest.write_text("".join(f"{file_sha256(f)}  {f.name}\n" for f in files))
    return file_sha256(manifest)


def weights_digest(folder: Path) -> str:
    """The sha256 a checkpoint folder's weights were recorded with (see write_weights_manifest)."""
    manifest = Path(folder) / WEIGHTS_MANIFEST
    return file_sha256(manifest if manifest.is_file() else Path(folder) / WEIGHTS)


def weights_refusal(folder: Path, sha256: str) -> str | None:
    """Why the weights in `folder` are not the ones `sha256` names (naming the file), or None."""
    folder = Path(folder)
    manifest = folder / WEIGHTS_MANIFEST
    if not manifest.is_file():
        if not (folder / WEIGHTS).is_file():
            return f"no {WEIGHTS} (or {WEIGHTS_MANIFEST} for shards) in {folder}"
        if file_sha256(folder / WEIGHTS) != sha256:
            return f"{folder / WEIGHTS} does not have the sha256 recorded for it"
        return None
    if file_sha256(manifest) != sha256:
        return f"{manifest} does not have the sha256 recorded for it"
    listed = {}
    for line in manifest.read_text().splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    present = {f.name for f in weight_files(folder)}
    for name in sorted(present ^ set(listed)):
        return f"{folder / name} is {'not in' if name in present else 'missing, but listed in'} {WEIGHTS_MANIFEST}"
    for name, digest in sorted(listed.items()):
        if file_sha256(folder / name) != digest:
            return f"{folder / name} does not have the sha256 {WEIGHTS_MANIFEST} lists for it"
    return None


def registry_refusal(files: LakeFiles, model_kind: str, version: int, path: str, sha256: str) -> tuple[str, str] | None:
    """Why a checkpoint event may not be registered in the lake whose files are `files` ((check, reason)), or None.
    On a remote lake the folder is fetched into the cache to be hashed (and is then ready for whoever loads it)."""
    expected = checkpoint_path(model_kind, version)
    if path != expected:
        return "registry_path", f"registry_path: path {path!r:.80} is not the lake-relative {expected}"
    cached_ok = []  # a cached copy that already hashed right is not hashed a second time

    def current(cached: Path) -> bool:
        cached_ok.append(weights_refusal(cached, sha256) is None)
        return cached_ok[-1]

    folder = files.fetch_folder(expected, current)
    if not (folder / WEIGHTS).is_file() and not (folder / WEIGHTS_MANIFEST).is_file():
        return "registry_files", f"registry_files: the lake holds no {expected}/{WEIGHTS} (or {WEIGHTS_MANIFEST})"
    if not any(cached_ok) and weights_refusal(folder, sha256):
        return "registry_sha256", f"registry_sha256: the weights in {expected} do not have the sha256 the event names"
    return None
