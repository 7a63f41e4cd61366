"""A lake on s3://, served by moto's standalone S3 server on 127.0.0.1: delta-rs, Polars and obstore talk to it with
their real HTTP clients. A quick run in mixed precision, an audit and a replay; run configs, checkpoints and reports
in the bucket; a remote lake genenv cannot use stops before any work."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pytest
from conftest import free_port, genenv_cli, genenv_inline, http_server
from safetensors import safe_open

from lake import Lake, LakeError, LakeFiles, read_table, silver
from trainers.checkpoints import reserve_version

SERVER = Path(__file__).with_name("s3_server.py")


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on a free local port (one request at a time: tests/s3_server.py says why); the AWS_* options
    that point genenv at it, with a bucket `lake`."""
    port = free_port()
    server = http_server([sys.executable, str(SERVER), "127.0.0.1", str(port)], port, "moto's S3 server")
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ALLOW_HTTP": "true",
    }
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket="lake")
    yield env, client
    server.kill()
    server.wait()


def keys(client, prefix: str) -> set[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket="lake", Prefix=prefix)
    return {item["Key"] for page in pages for item in page.get("Contents", [])}


@pytest.mark.e2e
def test_a_quick_bf16_run_an_audit_a_replay_and_a_prune_on_an_s3_lake(s3, tmp_path, monkeypatch):
    """The run is in mixed precision (dtype = bf16: fp32 master weights, bf16 compute, checkpoints of the fp32
    weights trained), which replays as bit for bit as fp32 (the quick run of test_audit.py). It trains the agent on
    the seed tasks (seeds-only): what is on trial is the bucket and the precision, which the agent's warm start and
    updates exercise as the simulator's would, and a tiny simulator writes valid tasks only after 150 passes of
    warm start, which bf16 without hardware support (AVX2 only) made 4x slower: 316 s of this test, run and replay."""
    env, client = s3
    root = "s3://lake/quick"
    # The run writes checkpoints through one local cache; the audit and replay start from an empty one, so
    # everything they load comes from the bucket.
    run = genenv_cli(
        "run",
        "--profile",
        "quick",
        "--mode",
        "seeds-only",
        "--lake",
        root,
        "--seed",
        "1",
        "--epochs",
        "2",  # the warm start and two updates: three agent versions, so the prune below has one to delete
        "--set",
        "agent.beta=0.04",
        "--set",
        "dtype=bf16",
        "--set",
        "warm_start_epochs=10",
        env={**env, "GENENV_CACHE": str(tmp_path / "run-cache")},
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "report uploaded to s3://lake/quick/reports/" in run.stdout

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GENENV_CACHE", str(tmp_path / "audit-cache"))
    lake = Lake(root, create=False)
    tasks = read_table(lake, silver("task"))
    run_id = tasks["run_id"][0]
    stored = keys(client, "quick/")
    assert f"quick/runs/{run_id}.toml" in stored
    assert f"quick/reports/{run_id}/report.md" in stored
    registry = read_table(lake, "registry/checkpoints")
    assert registry.height >= 3  # the agent's warm start and a GRPO update each epoch
    for row in registry.iter_rows(named=True):
        assert f"quick/{row['path']}/model.safetensors" in stored
        lineage = json.loads(client.get_object(Bucket="lake", Key=f"quick/{row['path']}/genenv.json")["Body"].read())
        assert lineage["precision"] == {"device": "cpu", "dtype": "bf16"}
        weights_file = tmp_path / "weights.safetensors"
        client.download_file("lake", f"quick/{row['path']}/model.safetensors", str(weights_file))
        with safe_open(str(weights_file), "pt") as weights:
            assert {weights.get_slice(k).get_dtype() for k in weights.keys()} == {"F32"}, row["path"]
    # Nothing of the lake was written beside it on the local disk.
    assert not (tmp_path / "s3:").exists()

    valid = tasks.filter(tasks["valid"])["task_id"][0]
    audit = genenv_inline(
        "audit", "task", valid, "--lake", root, "--json", env={**env, "GENENV_CACHE": str(tmp_path / "audit-cache")}
    )
    assert audit.returncode == 0, audit.stderr[-2000:]
    record = json.loads(audit.stdout)
    assert len(record["rollouts"]) == 4 and record["checkpoints"]

    # Replay the first epoch (the bf16 warm start and the GRPO update after it; the quick profile keeps every group,
    # so the epoch has its update): it reproduces every checkpoint the epoch registered, bit for bit.
    replay = genenv_cli(
        "replay",
        "--epoch",
        "0",
        "--lake",
        root,
        "--json",
        env={**env, "GENENV_CACHE": str(tmp_path / "replay-cache")},
        timeout=600,
    )
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-3000:]
    answer = json.loads(replay.stdout[replay.stdout.index("{") :])
    assert answer["ok"] and answer["checkpoints"]
    registered = registry.filter(registry["epoch"] == 0)
    assert len(answer["checkpoints"]) == registered.height, answer["checkpoints"]
    for c in answer["checkpoints"]:
        assert c["replayed_sha256"] == c["recorded_sha256"], c

    # Retention lists and deletes checkpoint folders in the bucket (keeping the last version and its parent); the
    # registry keeps every version's lineage.
    agent_versions = sorted(registry.filter(registry["model_kind"] == "agent")["version"].to_list())
    prune = genenv_inline("lake", "prune", "--lake", root, "--keep-last", "1", "--apply", env=env)
    assert prune.returncode == 0, prune.stderr[-2000:]
    left = {key.split("/")[3] for key in keys(client, "quick/checkpoints/agent/")}
    assert left == {f"v{v}" for v in agent_versions[-2:]}, (left, agent_versions)
    assert read_table(lake, "registry/checkpoints").height == registry.height


@pytest.mark.integration
def test_a_run_config_in_the_bucket_is_written_once(s3, monkeypatch):
    env, client = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    files = LakeFiles("s3://lake/once", env)
    files.write_text_once("runs/r.toml", "first")
    files.write_text_once("runs/r.toml", "second")  # a later worker of the same run: the first writer won
    assert files.read_text("runs/r.toml") == "first"
    assert files.read_text("runs/none.toml") is None


@pytest.mark.integration
@pytest.mark.parametrize("remote", [False, True])
def test_concurrent_updates_reserve_distinct_checkpoint_versions(s3, tmp_path, monkeypatch, remote):
    """Updates of two runs (or workers) on one lake at once each reserve their own version (a claim created only
    if absent: a conditional put on a bucket, an exclusive create on disk), above what the registry holds, so no
    update writes into another's folder; an update that found a number taken goes on to the next."""
    env, _ = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    lake = Lake(f"s3://lake/claims-{tmp_path.name}" if remote else tmp_path / "lake")
    with ThreadPoolExecutor(max_workers=8) as pool:
        versions = list(pool.map(lambda i: reserve_version(lake, "agent", 3, f"run {i}"), range(8)))
    assert sorted(versions) == list(range(4, 12))
    assert reserve_version(lake, "env", 0, "run 0") == 1 and reserve_version(lake, "env", 0, "run 1") == 2


def fetched_digest(root: str, env: dict, relative: str, cache: str) -> str:
    """In a process of its own: fetch a folder into the shared cache and read it back (its files' digest)."""
    import hashlib
    import os

    os.environ["GENENV_CACHE"] = cache
    folder = LakeFiles(root, env).fetch_folder(relative, lambda cached: (cached / "model.safetensors").is_file())
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())).hexdigest()


@pytest.mark.integration
def test_processes_share_one_checkpoint_cache_and_it_keeps_to_its_bound(s3, tmp_path, monkeypatch):
    """Four processes fetch the same checkpoint into one cache at once: each reads it whole (a folder is checked and
    replaced under its lock). Then, with a bound below two checkpoints, fetching one evicts the least recently
    used other, never the one fetched."""
    import hashlib
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    env, _ = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GENENV_CACHE", str(tmp_path / "writer"))
    files = LakeFiles("s3://lake/cached", env)
    for version in (1, 2):
        folder = files.local(f"checkpoints/agent/v{version}")
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(bytes([version]) * 2**20)
        files.upload_folder(f"checkpoints/agent/v{version}")
    whole = hashlib.sha256(b"{}" + bytes([1]) * 2**20).hexdigest()

    shared = str(tmp_path / "shared")
    with ProcessPoolExecutor(
        4, mp_context=multiprocessing.get_context("spawn")
    ) as pool:  # obstore's runtime and fork do not mix
        digests = list(pool.map(fetched_digest, *zip(*[("s3://lake/cached", env, "checkpoints/agent/v1", shared)] * 4)))
    assert digests == [whole] * 4

    monkeypatch.setenv("GENENV_CACHE", shared)
    monkeypatch.setenv("GENENV_CACHE_GB", str(1.5 / 1024))  # 1.5 MiB: room for one 1 MiB checkpoint
    reader = LakeFiles("s3://lake/cached", env)
    v1, v2 = (reader.local(f"checkpoints/agent/v{v}") for v in (1, 2))
    assert v1.is_dir() and not v2.exists()
    reader.fetch_folder("checkpoints/agent/v2")
    assert v2.is_dir() and not v1.exists()


@pytest.mark.integration
@pytest.mark.parametrize(
    "root, message",
    [
        ("gs://bucket/lake", "gs:// is not supported"),
        ("s3://no-such-bucket/lake", "cannot reach the lake at s3://no-such-bucket/lake: NoSuchBucket"),
    ],
)
def test_a_remote_lake_genenv_cannot_use_stops_before_any_work(s3, root, message, tmp_path):
    env, _ = s3
    result = genenv_inline("run", "--profile", "quick", "--lake", root, env={**env, "GENENV_CACHE": str(tmp_path)})
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "warm start" not in result.stdout


@pytest.mark.integration
def test_lake_refuses_an_unsupported_scheme_in_one_line():
    with pytest.raises(LakeError, match="az:// is not supported"):
        Lake("az://container/lake")
