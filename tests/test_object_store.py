"""A lake on s3://, served by moto's standalone S3 server on 127.0.0.1: delta-rs, Polars and obstore talk to it with
their real HTTP clients. A quick run, an audit and a replay; run configs, checkpoints and reports in the bucket; a
remote lake genenv cannot use stops before any work."""

from __future__ import annotations

import json
import sys

import boto3
import pytest
from conftest import free_port, genenv_cli, genenv_inline, http_server

from lake import Lake, LakeError, LakeFiles, read_table, silver


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on a free local port; the AWS_* options that point genenv at it, with a bucket `lake`."""
    port = free_port()
    server = http_server(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, "moto's S3 server"
    )
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
def test_a_quick_run_an_audit_a_replay_and_a_prune_on_an_s3_lake(s3, tmp_path, monkeypatch):
    env, client = s3
    root = "s3://lake/quick"
    # The run writes checkpoints through one local cache; the audit and replay start from an empty one, so
    # everything they load comes from the bucket.
    run = genenv_cli(
        "run",
        "--profile",
        "quick",
        "--lake",
        root,
        "--seed",
        "1",
        "--set",
        "agent.beta=0.04",
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
    assert registry.height >= 3  # the warm starts of both roles and at least one GRPO update of the agent
    for row in registry.iter_rows(named=True):
        assert f"quick/{row['path']}/model.safetensors" in stored
    # Nothing of the lake was written beside it on the local disk.
    assert not (tmp_path / "s3:").exists()

    valid = tasks.filter(tasks["valid"])["task_id"][0]
    audit = genenv_cli(
        "audit", "task", valid, "--lake", root, "--json", env={**env, "GENENV_CACHE": str(tmp_path / "audit-cache")}
    )
    assert audit.returncode == 0, audit.stderr[-2000:]
    record = json.loads(audit.stdout)
    assert len(record["rollouts"]) == 4 and record["checkpoints"]

    # Replay an epoch that registered a GRPO update of the agent (an epoch whose groups were all right or all
    # wrong trains nothing, and with the quick profile that can be epoch 1).
    updates = registry.filter((registry["model_kind"] == "agent") & registry["parent_version"].is_not_null())
    replay = genenv_cli(
        "replay",
        "--epoch",
        str(updates["epoch"].max()),
        "--lake",
        root,
        "--json",
        env={**env, "GENENV_CACHE": str(tmp_path / "replay-cache")},
        timeout=600,
    )
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-3000:]
    answer = json.loads(replay.stdout[replay.stdout.index("{") :])
    assert answer["ok"] and answer["checkpoints"]
    for c in answer["checkpoints"]:
        assert c["replayed_sha256"] == c["recorded_sha256"], c

    # Retention lists and deletes checkpoint folders in the bucket (keeping the last version and its parent); the
    # registry keeps every version's lineage.
    agent_versions = sorted(registry.filter(registry["model_kind"] == "agent")["version"].to_list())
    prune = genenv_cli("lake", "prune", "--lake", root, "--keep-last", "1", "--apply", env=env, timeout=120)
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
