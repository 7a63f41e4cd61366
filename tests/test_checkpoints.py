"""Checkpoints at scale: weights above the shard size are written as shards with a manifest of their sha256s,
which loading and the registry check file by file."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_trainers
import torch
from test_trainers import publish_epoch

from lake import WEIGHTS, WEIGHTS_MANIFEST, LakeFiles, checkpoint_path, registry_refusal, weight_files
from trainers import CheckpointError, load_model, load_verified
from trainers.checkpoints import save_checkpoint

pytestmark = pytest.mark.integration

pool_lake = test_trainers.pool_lake  # a fixture: pytest finds it by this name


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
    refusal = registry_refusal(LakeFiles(str(tmp_path), {}), "agent", 1, checkpoint_path("agent", 1), sha)
    assert refusal is not None and refusal[0] == "registry_sha256"
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    assert registry_refusal(LakeFiles(str(tmp_path), {}), "agent", 1, checkpoint_path("agent", 1), sha) is None
    manifest = folder / WEIGHTS_MANIFEST
    manifest.write_text(manifest.read_text().replace("  ", "   ", 1))
    with pytest.raises(CheckpointError, match=WEIGHTS_MANIFEST):
        load_verified(folder, sha)


def test_a_small_model_stays_one_file_whose_sha256_is_the_checkpoints(tmp_path):
    from lake import file_sha256

    loaded = load_model("tiny", seed=4)
    sha = save_checkpoint(loaded.model, loaded.tokenizer, tmp_path / "v1", {"version": 1})
    assert [f.name for f in weight_files(tmp_path / "v1")] == [WEIGHTS] and sha == file_sha256(
        tmp_path / "v1" / WEIGHTS
    )
    assert not (tmp_path / "v1" / WEIGHTS_MANIFEST).exists()


def test_pruning_keeps_the_last_versions_and_their_parents_says_why_and_keeps_every_registry_row(pool_lake, broker):
    """A chain v1 <- v2 <- v3: --keep-last 1 keeps v3 and its parent v2 (a replay of v3 retrains from it), deletes
    v1's folder only, and every registry row stays."""
    from conftest import genenv_inline

    from engine.coevolution import publish_checkpoint
    from lake import CHECKPOINTS, ingest, read_table
    from trainers import GRPOConfig, load_checkpoint, train_update

    # The toy epochs' rollouts all say agent version 0: stale for v2's update, which may take them.
    config = GRPOConfig(learning_rate=1e-3, per_device_train_batch_size=16, seed=7, max_staleness=5)
    for epoch in range(3):
        if epoch:
            publish_epoch(broker.bootstrap, epoch=epoch, seed=epoch)
            ingest(pool_lake, broker.bootstrap, idle_exit_s=1.5)
        record = train_update("agent", pool_lake, config, base_model="tiny")
        publish_checkpoint(pool_lake, broker.bootstrap, record, run_id="t", epoch=epoch)
    folders = Path(pool_lake.root) / "checkpoints" / "agent"
    assert sorted(p.name for p in folders.iterdir()) == ["v1", "v2", "v3"]

    dry = genenv_inline("lake", "prune", "--lake", pool_lake.root, "--keep-last", "1")
    assert dry.returncode == 0 and "dry run" in dry.stdout and "would be deleted" in dry.stdout, dry.stderr
    assert sorted(p.name for p in folders.iterdir()) == ["v1", "v2", "v3"]
    applied = genenv_inline("lake", "prune", "--lake", pool_lake.root, "--keep-last", "1", "--apply")
    assert applied.returncode == 0, applied.stderr
    assert sorted(p.name for p in folders.iterdir()) == ["v2", "v3"]
    assert "one of the last 1" in applied.stdout and "parent of v3" in applied.stdout
    assert read_table(pool_lake, CHECKPOINTS).height == 3  # every version's lineage stays answerable
    with pytest.raises(CheckpointError, match="is not in the lake"):
        load_checkpoint(pool_lake, "agent", 1)
    load_checkpoint(pool_lake, "agent", 2)  # the kept parent still loads
    # Vacuum: nothing has left the tables for an hour yet, so nothing would go (tests/test_ingest.py deletes).
    vacuumed = genenv_inline("lake", "vacuum", "--lake", pool_lake.root)
    assert vacuumed.returncode == 0 and "no file to delete" in vacuumed.stdout, vacuumed.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (mounting needs root, as on the project's CI machines; elsewhere the test skips)."""
    import subprocess

    folder = tmp_path / "small-disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()[:100]}")
    yield folder
    subprocess.run(["umount", str(folder)], check=False)


def test_a_checkpoint_on_a_full_disk_is_one_named_error_and_leaves_no_partial_folder(small_disk):
    from engine.cli.app import DISK_FULL, disk_full
    from trainers import OptimizerState

    loaded = load_model("tiny")
    state = OptimizerState({"state": {0: {"exp_avg": torch.zeros(2**18)}}, "param_groups": []}, step=3)
    target = small_disk / "checkpoints" / "agent" / "v2"
    target.parent.mkdir(parents=True)
    with pytest.raises(OSError) as caught:
        save_checkpoint(loaded.model, loaded.tokenizer, target, {"version": 2}, optimizer=state)
    assert caught.value.errno == 28 and str(target) in str(caught.value)  # ENOSPC, naming what was being written
    assert disk_full(caught.value) and "genenv lake prune" in DISK_FULL
    assert list(target.parent.iterdir()) == []  # neither the checkpoint nor its .partial folder
