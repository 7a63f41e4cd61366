"""Checkpoint retention: which checkpoint folders a lake keeps, and why; the others may be deleted.

    keep   the last `keep_last` versions of each kind, and every `keep_every`-th version
    keep   the parent of each version kept for those reasons: its replay retrains from that parent
    keep   a version the registry does not hold yet (a trainer may be publishing it)

Only weights go: registry rows are never deleted, so a pruned version's lineage (parent, pool version, config,
seed, sha256) stays answerable; loading it fails with one line saying its folder is not in the lake.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lake import Lake, checkpoint_path

from .checkpoints import KINDS, registry


@dataclass
class Retention:
    kind: str
    keep: dict[int, str] = field(default_factory=dict)  # version -> why it stays
    delete: list[int] = field(default_factory=list)  # versions whose folders may go


def plan_retention(lake: Lake, kind: str, keep_last: int, keep_every: int = 0) -> Retention:
    """What to keep and what to delete among the checkpoint folders of one kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; kinds: {', '.join(KINDS)}")
    if keep_last < 1 or keep_every < 0:
        raise ValueError("keep_last must be >= 1 and keep_every >= 0")
    rows = registry(lake, kind)
    versions = rows["version"].to_list()
    parents = dict(zip(versions, rows["parent_version"].to_list()))
    plan = Retention(kind)
    for version in versions[-keep_last:]:
        plan.keep[version] = f"one of the last {keep_last}"
    for version in versions:
        if keep_every and version % keep_every == 0:
            plan.keep.setdefault(version, f"every {keep_every}th version")
    for version in list(plan.keep):
        parent = parents.get(version)
        if parent and parent not in plan.keep:
            plan.keep[parent] = f"parent of v{version}: replaying v{version} retrains from it"
    folders = lake.files.folders(checkpoint_path(kind, 0).rsplit("/", 1)[0])
    on_disk = sorted(int(name[1:]) for name in folders if name.startswith("v") and name[1:].isdigit())
    for version in on_disk:
        if version not in parents:
            plan.keep.setdefault(version, "not registered (yet): a trainer may be publishing it")
        elif version not in plan.keep:
            plan.delete.append(version)
    plan.keep = dict(sorted(plan.keep.items()))
    return plan


def apply_retention(lake: Lake, plan: Retention) -> list[str]:
    """Delete the folders the plan lets go; the deleted folders' paths."""
    deleted = []
    for version in plan.delete:
        folder = checkpoint_path(plan.kind, version)
        lake.files.remove_folder(folder)
        deleted.append(f"{lake.root}/{folder}")
    return deleted
