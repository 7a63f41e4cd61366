"""The co-evolution's roles are components: building one loads no model, opens no connection and writes nothing;
loading is its own step, and the roles compose into the sync loop by their public methods alone."""

from __future__ import annotations

import ast
import dataclasses
import random
import socket
from pathlib import Path

import pytest
from conftest import ROOT

from engine.coevolution import CoEvolution, GeneratedTask, Rollouts, Scorer, Simulator, Updater, load_config
from engine.domains import get_domain
from engine.workers import ROLES, worker
from lake import Lake
from trainers import ModelNotFound

pytestmark = pytest.mark.unit


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_building_a_role_loads_no_model_and_opens_no_connection(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))  # a real port: any client that connects is seen here
    listener.setblocking(False)
    bootstrap = f"127.0.0.1:{listener.getsockname()[1]}"
    missing = str(tmp_path / "no-such-model")  # loading it would raise ModelNotFound
    config = dataclasses.replace(
        load_config("quick", None, ["mode=genenv", "seed=3"]), agent_model=missing, env_model=missing
    )
    lake = Lake(tmp_path / "lake")
    before = tree(tmp_path)

    domain = get_domain(config.domain)
    simulator, rollouts = Simulator(config, domain, "r1"), Rollouts(config, domain, "r1")
    built = [
        simulator,
        rollouts,
        Scorer(config, domain, "r1"),
        Updater("agent", config, "r1"),
        Updater("env", config, "r1"),
        CoEvolution(config, lake, writer=None, run_id="r1"),
        *[worker(role, config, lake, bootstrap, "r1") for role in ROLES],
    ]

    assert len(built) == 6 + len(ROLES)
    assert simulator.model is None and rollouts.model is None
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected
    assert tree(tmp_path) == before, "building a role wrote to the lake"
    with pytest.raises(ModelNotFound):
        rollouts.load(lake, 0)  # loading is the step that reads weights
    listener.close()


# Private names of libraries that offer no public way to the same fact, each with its reason.
LIBRARY_PRIVATE_NAMES = {
    "_attn_implementation": "transformers' config holds the attention kind (sdpa, eager, flash) and has no getter",
    "_exit": "os._exit is the standard library's public way to end a process without the interpreter's exit",
}


def test_no_module_calls_another_modules_private_names():
    """`a._b` where `a` is not self/cls names something private to another module or object."""
    offenders = []
    for package in ("engine", "lake", "streams", "trainers"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and node.attr not in LIBRARY_PRIVATE_NAMES
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
                if isinstance(node, ast.ImportFrom) and any(a.name.startswith("_") for a in node.names):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: import {[a.name for a in node.names]}")
    assert not offenders, offenders


def sampled(lake: Lake, run_id: str, overrides: list[str]) -> tuple[list[str], list[list[int]]]:
    """What a quick run's simulator writes in epoch 0 (two requests) and its agent's rollouts of two seed tasks."""
    config = load_config("quick", None, overrides)
    domain = get_domain(config.domain)
    simulator, rollouts = Simulator(config, domain, run_id), Rollouts(config, domain, run_id)
    simulator.load(lake, 0)
    rollouts.load(lake, 0)
    written = simulator.write(0, 2, [])
    seeds = domain.seeds(random.Random(0), 2)  # tasks the agent can attempt, named as a run names its tasks
    tasks = [
        GeneratedTask(f"{run_id}-e0-t{i}", f"{run_id}-e0-b0", "", text, task, "0", 0)
        for i, (_, text, task) in enumerate(seeds)
    ]
    return [t.generation for t in written], [r.completion_token_ids for r in rollouts.roll_out(tasks, 0)]


def test_two_runs_of_one_config_sample_alike_and_another_seed_does_not(tmp_path):
    """No sampling seed takes the run id: the simulator's generations and the agent's rollouts of a run named r1
    are those of the same config named r2 (so `genenv run` repeats), and a run at another seed draws others."""
    lake = Lake(tmp_path / "lake")
    first = sampled(lake, "r1", ["seed=3"])
    assert first == sampled(lake, "r2", ["seed=3"])
    assert first != sampled(lake, "r1", ["seed=4"])


def test_the_simulator_samples_at_its_own_temperature_and_the_agent_at_the_runs(tmp_path):
    """simulator_temperature changes what the simulator writes and nothing the agent samples; 0 is the run's
    temperature."""
    lake = Lake(tmp_path / "lake")

    def at(simulator_temperature: float) -> tuple[list[str], list[list[int]]]:
        return sampled(lake, "r1", ["seed=3", f"simulator_temperature={simulator_temperature}"])

    cool_requests, cool_rollouts = at(0.7)
    hot_requests, hot_rollouts = at(2.0)
    assert cool_requests != hot_requests
    assert cool_rollouts == hot_rollouts
    assert at(0.0) == at(1.0)  # 0: the run's temperature (the quick profile's 1.0)
