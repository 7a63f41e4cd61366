"""Where checkpoints live in a lake, and which CheckpointPublished events may enter its registry.

    <lake>/checkpoints/<kind>/v<version>/model.safetensors (and config, tokenizer, genenv.json)

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

CHECKPOINTS_DIR = "checkpoints"
WEIGHTS = "model.safetensors"


def checkpoint_path(kind: str, version: int) -> str:
    """A checkpoint's folder, relative to the lake root."""
    return f"{CHECKPOINTS_DIR}/{kind}/v{version}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def registry_refusal(root: str, model_kind: str, version: int, path: str, sha256: str) -> tuple[str, str] | None:
    """Why a checkpoint event may not be registered in the lake at `root` ((check, reason)), or None."""
    expected = checkpoint_path(model_kind, version)
    if path != expected:
        return "registry_path", f"registry_path: path {path!r:.80} is not the lake-relative {expected}"
    if "://" in root:
        return "registry_files", f"registry_files: checkpoints live under a local lake root, not {root}"
    weights = Path(root) / expected / WEIGHTS
    if not weights.is_file():
        return "registry_files", f"registry_files: the lake holds no {expected}/{WEIGHTS}"
    if file_sha256(weights) != sha256:
        return "registry_sha256", f"registry_sha256: {expected}/{WEIGHTS} does not have the sha256 the event names"
    return None
