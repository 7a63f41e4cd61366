"""The command line as a user runs it: ingest, lake status, and one-line errors (the main job: test_engine.py)."""

import os
import subprocess
import sys

import pytest
from conftest import genenv_cli, genenv_inline
from demo_events import epoch_events, publish

from lake import Lake, read_pool

pytestmark = pytest.mark.integration


def test_ingest_lands_published_epochs_then_status_reports_them(tmp_path, broker):
    lake = tmp_path / "lake"
    publish(broker.bootstrap, epoch_events(epoch=0, tasks=4, group=2) + epoch_events(epoch=1, tasks=4, group=2))
    result = genenv_cli("ingest", "--lake", str(lake), "--bootstrap", broker.bootstrap, "--idle-exit", "2", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_pool(Lake(lake, create=False), "d_train").height == 2 * 4 * 2
    assert read_pool(Lake(lake, create=False), "d_env").height == 2 * 4
    status = genenv_inline("lake", "status", "--lake", str(lake))
    assert status.returncode == 0 and "gold/d_train" in status.stdout


def test_bad_paths_and_values_stop_with_one_line(tmp_path):
    missing = genenv_inline("lake", "status", "--lake", str(tmp_path / "nowhere"))
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "no lake at" in missing.stderr
    a_file = tmp_path / "file"
    a_file.write_text("x")
    not_dir = genenv_inline("ingest", "--lake", str(a_file))
    assert not_dir.returncode == 2 and "not a directory" in not_dir.stderr
    zero = genenv_inline("ingest", "--lake", str(tmp_path / "l"), "--partitions", "0")
    assert zero.returncode == 2 and "--partitions must be >= 1" in zero.stderr
    assert not (tmp_path / "l").exists(), "a bad value must stop before any work"


BAD_INVOCATIONS = {  # name: (arguments, what the one line says); LAKE is a path that must not be created
    "lake_cannot_be_created_ingest": (
        ["ingest", "--lake", "/proc/genenv-lake"],
        "cannot create a lake at /proc/genenv-lake",
    ),
    "lake_cannot_be_created_run": (
        ["run", "--profile", "quick", "--lake", "/proc/genenv-lake"],
        "cannot create a lake",
    ),
    "lake_cannot_be_created_eval": (
        ["eval", "--benchmark", "bfcl", "--model", "tiny", "--limit", "1", "--lake", "/proc/genenv-lake"],
        "cannot create a lake",
    ),
    "lake_is_a_file": (["ingest", "--lake", "FILE"], "not a directory"),
    "unreachable_broker_ingest": (
        ["ingest", "--lake", "LAKE", "--bootstrap", "127.0.0.1:1"],
        "no Kafka broker answered at 127.0.0.1:1 within 1s",
    ),
    "unreachable_broker_run": (
        ["run", "--profile", "quick", "--lake", "LAKE", "--bootstrap", "127.0.0.1:1"],
        "no Kafka broker answered",
    ),
    "unresolvable_broker": (
        ["ingest", "--lake", "LAKE", "--bootstrap", "no-such-host.invalid:9092"],
        "no Kafka broker answered",
    ),
    "malformed_bootstrap": (["ingest", "--lake", "LAKE", "--bootstrap", "127.0.0.1:99999"], "not host:port"),
    "negative_max_wait": (["ingest", "--lake", "LAKE", "--max-wait", "-1"], "--max-wait must be >= 0"),
    "negative_idle_exit": (["ingest", "--lake", "LAKE", "--idle-exit", "-5"], "--idle-exit must be >= 0"),
    "broker_port_too_high": (["broker", "--port", "99999"], "--port must be in 0-65535"),
    "broker_port_negative": (["broker", "--port", "-5"], "--port must be in 0-65535"),
    "ui_port_too_high": (["ui", "--lake", "LAKE", "--port", "99999"], "--port must be in 1-65535"),
    "ablation_unknown_mode": (
        ["experiment", "ablation", "--lake", "LAKE", "--modes", "genenv,nope"],
        "--modes takes some of",
    ),
    "ablation_jobs_with_bootstrap": (
        ["experiment", "ablation", "--lake", "LAKE", "--jobs", "2", "--bootstrap", "127.0.0.1:9092"],
        "--jobs runs each job with a broker of its own",
    ),
    "ablation_jobs_past_the_cores": (
        ["experiment", "ablation", "--lake", "LAKE", "--jobs", "999"],
        "--jobs must be at most",
    ),
    "replay_scratch_is_a_file": (["replay", "--epoch", "0", "--lake", "LAKE", "--scratch", "FILE"], "is a file"),
    # This machine has no CUDA (the suite runs on CPU): a run that asks for it stops before any model is loaded.
    "vllm_without_cuda": (
        ["run", "--profile", "quick", "--lake", "LAKE", "--set", "backend=vllm"],
        "backend = vllm cannot run here: CUDA is not available",
    ),
    "vllm_server_without_cuda": (  # its client pushes each checkpoint's weights over NCCL, from a CUDA device
        ["run", "--profile", "quick", "--lake", "LAKE", "--set", "backend=vllm-server"],
        "backend = vllm-server cannot run here: CUDA is not available",
    ),
    "cuda_device_without_cuda": (
        ["run", "--profile", "quick", "--lake", "LAKE", "--set", "device=cuda"],
        "device cuda: CUDA is not available",
    ),
    "fsdp_on_cpu": (
        ["train", "agent", "--lake", "LAKE", "--num-processes", "2", "--set", "fsdp=full_shard"],
        "fsdp='full_shard' shards over GPUs",
    ),
    "fsdp_with_lora": (
        ["train", "agent", "--lake", "LAKE", "--set", "fsdp=full_shard", "--set", "use_peft=true"],
        "fsdp shards full fine-tuning",
    ),
    "fsdp_unknown": (["train", "env", "--lake", "LAKE", "--set", "fsdp=zero3"], "fsdp must be one of"),
    "vllm_worker_without_cuda": (
        ["worker", "rollout", "--run-id", "r1", "--lake", "LAKE", "--set", "backend=vllm"],
        "backend = vllm cannot run here",
    ),
    "bad_dtype": (
        ["run", "--profile", "quick", "--lake", "LAKE", "--set", "dtype=fp8"],
        "dtype must be auto, fp32, bf16, fp16",
    ),
    "negative_positional": (["audit", "epoch", "-1", "--lake", "LAKE"], "-1: a negative number is never an epoch"),
    "unknown_option": (["run", "--profile", "quick", "--nope"], "No such option: --nope"),
    "missing_argument": (["audit", "epoch", "--lake", "LAKE"], "Missing argument 'epoch'"),
    "unknown_model_run": (
        ["run", "--profile", "quick", "--lake", "LAKE", "--set", "agent_model=no-such-model"],
        "agent_model: unknown model 'no-such-model'",
    ),
    "unknown_model_ablation": (
        ["experiment", "ablation", "--profile", "quick", "--lake", "LAKE", "--set", "env_model=/no/such/dir"],
        "env_model: unknown model '/no/such/dir'",
    ),
    "report_folder_is_a_file": (
        ["run", "--profile", "quick", "--lake", "LAKE", "--report", "FILE"],
        "cannot create the folder (File exists)",
    ),
    "ablation_out_cannot_be_created": (
        ["experiment", "ablation", "--profile", "quick", "--lake", "LAKE", "--out", "/proc/genenv-out"],
        "--out /proc/genenv-out: cannot create the folder",
    ),
    "nan_in_a_config": (
        ["run", "--profile", "quick", "--lake", "LAKE", "--set", "curriculum.k=nan"],
        "curriculum.k=nan: expected a finite number",
    ),
    "vacuum_retention_under_an_hour": (
        ["lake", "vacuum", "--lake", "LAKE", "--retain-hours", "0.5"],
        "--retain-hours must be at least 1",
    ),
    "ingest_retention_under_an_hour": (
        ["ingest", "--lake", "LAKE", "--retain-hours", "0.5"],
        "--retain-hours must be 0 or at least 1",
    ),
    "plan_cannot_fit": (
        ["run", "--profile", "quick", "--lake", "LAKE", "--set", "agent.per_device_train_batch_size=100000000"],
        "memory plan: does not fit",
    ),
}


def test_the_memory_plan_prints_its_table_and_a_verdict():
    """The paper profile fits one 141 GB GPU (LoRA, gradient checkpointing, two vLLM engines of 15%); the same on a
    40 GB GPU does not, and says what to change."""
    fits = genenv_inline("plan", "--profile", "paper", "--gpu-memory", "141")
    assert fits.returncode == 0, fits.stderr
    for row in ("vLLM reservation", "master", "gradients", "optimizer", "reference", "activations", "peak"):
        assert row in fits.stdout
    assert "fits:" in fits.stdout and "of 141 GiB per device (1 x 141 GiB cuda)" in fits.stdout
    small = genenv_inline("plan", "--profile", "paper", "--gpu-memory", "40")
    assert small.returncode == 0 and "does not fit" in small.stdout and "FSDP" in small.stdout
    sharded = genenv_inline(
        "plan",
        "--profile",
        "paper",
        "--gpus",
        "8",
        "--gpu-memory",
        "80",
        "--set",
        "agent.use_peft=false",
        "--set",
        "env.use_peft=false",
        "--set",
        "agent.fsdp=full_shard",
        "--set",
        "env.fsdp=full_shard",
    )
    assert sharded.returncode == 0 and "FSDP" in sharded.stdout and "fits:" in sharded.stdout, sharded.stdout
    unknown = genenv_inline("plan", "--set", "agent_model=/no/such/model")
    assert unknown.returncode == 2 and "cannot plan memory for '/no/such/model'" in unknown.stderr


def test_the_async_plan_counts_every_workers_engine_and_both_updates_at_once():
    """The async workers share one GPU: an engine per rollout worker, the agent trainer's validation engine and the
    simulator's, both updates together, and a CUDA context per process. What fits the sync loop on 100 GiB does
    not fit async (`genenv run --async` checks this plan before any work)."""
    from engine.coevolution import load_config
    from trainers.plan import CUDA_CONTEXT, plan_run

    config = load_config("paper", None, ["rollout_workers=2"])
    sync = plan_run(config, memory_gib=100, device="cuda")
    streaming = plan_run(config, memory_gib=100, device="cuda", asynchronous=True)
    engine = int(config.gpu_memory_utilization * 100 * 2**30)
    assert list(streaming.generation.values()) == [engine] * 4  # 2 rollout workers, validation, simulator
    updates = sum(u.total for u in streaming.updates)
    assert streaming.peak == 4 * engine + updates + 5 * CUDA_CONTEXT  # 2 rollout workers, simulator, 2 trainers
    assert sync.fits and not streaming.fits
    shown = genenv_inline("plan", "--profile", "paper", "--gpu-memory", "100", "--set", "rollout_workers=2", "--async")
    assert shown.returncode == 0 and "rollout worker 1" in shown.stdout and "does not fit" in shown.stdout


def test_the_plan_counts_the_ptx_terms_rows_where_they_outnumber_grpos():
    """GRPO's ptx term is backpropagated apart from its own: a micro-batch's activations are those of the larger
    term, and a ptx term that is off adds nothing whatever its batch size."""
    from engine.coevolution import load_config
    from trainers.plan import plan_run

    def agent_activations(*sets: str) -> int:
        plan = plan_run(load_config("default", None, list(sets)), memory_gib=24, device="cpu")
        return next(u.activations for u in plan.updates if u.role == "agent")

    grpo = agent_activations("agent.per_device_train_batch_size=8", "agent.ptx_batch_size=4")
    assert agent_activations("agent.per_device_train_batch_size=8", "agent.ptx_batch_size=8") == grpo
    assert agent_activations("agent.per_device_train_batch_size=8", "agent.ptx_batch_size=16") == 2 * grpo
    off = ("agent.per_device_train_batch_size=8", "agent.ptx_batch_size=16", "agent.ptx_coef=0")
    assert agent_activations(*off) == grpo


@pytest.mark.parametrize("name", list(BAD_INVOCATIONS))
def test_a_bad_invocation_is_one_line_and_exit_2_and_creates_nothing(name, tmp_path):
    args, message = BAD_INVOCATIONS[name]
    (tmp_path / "file").write_text("x")
    args = [str(tmp_path / "lake") if a == "LAKE" else str(tmp_path / "file") if a == "FILE" else a for a in args]
    result = genenv_inline(*args, env={"GENENV_BROKER_WAIT_S": "1", "GENENV_KAFKA_BOOTSTRAP": ""})
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"], "a bad invocation must not create anything"


def test_a_log_file_gets_one_line_per_phase_where_a_terminal_gets_a_bar(monkeypatch):
    """rich draws no progress bar where stdout is not a terminal, so a run written to a log says each phase once,
    as it ends, with the work done and its time; a terminal's bar leaves nothing behind (transient)."""
    import io
    import re

    from rich.console import Console

    from engine.cli import render

    for terminal, expected in ((False, ["rollouts: 3/8", "ingest: done"]), (True, [])):
        out = io.StringIO()
        monkeypatch.setattr(render, "console", Console(file=out, force_terminal=terminal, width=100))
        with render.phases() as phase:
            with phase("rollouts") as tick:
                tick(3, 8)
            with phase("ingest"):
                pass
        lines = [line for line in out.getvalue().splitlines() if line.strip()]
        said = [m.group(1) for m in (re.fullmatch(r"(\w+: [\w/]+) in \d+\.\d s", line) for line in lines) if m]
        assert said == expected and (terminal or len(lines) == len(said)), lines


def test_the_command_bounds_onednns_kernel_cache_unless_the_user_set_it():
    """oneDNN's primitive cache is bounded before any work (engine/cli/app.py says why); a value the user set stays."""
    probe = (
        "import os, sys\nfrom engine.cli.app import main\n"
        "try:\n    main(['lake', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('capacity', os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], file=sys.stderr)"
    )
    for preset, expected in ((None, "32"), ("7", "7")):
        env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
        if preset is not None:
            env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = preset
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
        assert f"capacity {expected}" in done.stderr, done.stderr[-2000:]
