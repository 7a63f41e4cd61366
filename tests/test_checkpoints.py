"""Checkpoints at scale: weights above the shard size are written as shards with a manifest of their sha256s,
which loading and the registry check file by file."""

from __future__ import annotations

import pytest
import torch

from lake import WEIGHTS, WEIGHTS_MANIFEST, checkpoint_path, registry_refusal, weight_files
from trainers import CheckpointError, load_model, load_verified
from trainers.checkpoints import save_checkpoint


@pytest.fixture
def sharded(tmp_path):
    loaded = load_model("tiny", seed=4)
    folder = tmp_path / checkpoint_path("agent", 1)
    folder.parent.mkdir(parents=True)
    sha = save_checkpoint(loaded.model, loaded.tokenizer, folder, {"version": 1}, max_shard_size="100KB")
    return loaded, folder, sha


def test_a_sharded_checkpoint_loads_whole_after_every_shard_is_checked(sharded):
    loaded, folder, sha = sharded
    shards = weight_files(folder)
    assert len(shards) > 1 and not (folder / WEIGHTS).exists() and (folder / WEIGHTS_MANIFEST).is_file()
    listed = [line.split("  ")[1] for line in (folder / WEIGHTS_MANIFEST).read_text().splitlines()]
    assert listed == [s.name for s in shards]  # sha256sum's format: `sha256sum -c weights.sha256` checks it
    again = load_verified(folder, sha)
    for name, tensor in loaded.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[name], tensor), name


def test_a_changed_byte_in_a_shard_or_the_manifest_is_refused_naming_the_file(sharded, tmp_path):
    _, folder, sha = sharded
    shard = weight_files(folder)[1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=shard.name):
        load_verified(folder, sha)
    refusal = registry_refusal(str(tmp_path), "agent", 1, checkpoint_path("agent", 1), sha)
    assert refusal is not None and refusal[0] == "registry_sha256"
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    assert registry_refusal(str(tmp_path), "agent", 1, checkpoint_path("agent", 1), sha) is None
    manifest = folder / WEIGHTS_MANIFEST
    manifest.write_text(manifest.read_text().replace("  ", "   ", 1))
    with pytest.raises(CheckpointError, match=WEIGHTS_MANIFEST):
        load_verified(folder, sha)


def test_a_small_model_stays_one_file_whose_sha256_is_the_checkpoints(tmp_path):
    from lake import file_sha256

    loaded = load_model("tiny", seed=4)
    sha = save_checkpoint(loaded.model, loaded.tokenizer, tmp_path / "v1", {"version": 1})
    assert [f.name for f in weight_files(tmp_path / "v1")] == [WEIGHTS] and sha == file_sha256(tmp_path / "v1" / WEIGHTS)
    assert not (tmp_path / "v1" / WEIGHTS_MANIFEST).exists()


def test_pruning_keeps_the_last_versions_and_their_parents_says_why_and_keeps_every_registry_row(quick_run, tmp_path):
    import shutil

    from lake import CHECKPOINTS, Lake, read_table
    from trainers import load_checkpoint, registry

    from conftest import genenv_cli

    source, _ = quick_run
    copy = tmp_path / "lake"
    shutil.copytree(source.root, copy)
    lake = Lake(copy, create=False)
    rows_before = read_table(lake, CHECKPOINTS).height
    dry = genenv_cli("lake", "prune", "--lake", str(copy), "--keep-last", "1", timeout=120)
    assert dry.returncode == 0 and "dry run" in dry.stdout, dry.stderr
    assert all((copy / "checkpoints" / k).iterdir() for k in ("agent", "env"))
    applied = genenv_cli("lake", "prune", "--lake", str(copy), "--keep-last", "1", "--apply", timeout=120)
    assert applied.returncode == 0, applied.stderr
    pruned = []
    for kind in ("agent", "env"):
        rows = registry(lake, kind)
        last = rows["version"].max()
        parent = dict(zip(rows["version"], rows["parent_version"]))[last]
        kept = {int(p.name[1:]) for p in (copy / "checkpoints" / kind).iterdir()}
        assert kept == {last} | ({parent} if parent else set())
        assert "parent of v" in applied.stdout if parent else True
        pruned += [(kind, v) for v in rows["version"] if v not in kept]
    assert pruned, "the quick run has versions older than the last one and its parent"
    assert read_table(lake, CHECKPOINTS).height == rows_before  # lineage stays answerable
    kind, version = pruned[0]
    with pytest.raises(CheckpointError, match="is not in the lake"):
        load_checkpoint(lake, kind, version)
