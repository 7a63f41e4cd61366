"""The co-evolution engine: the curriculum on hand-computed cases, the checkers against malicious answers,
the run configuration, and a quick run end to end through the real broker and lake."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT, genenv_cli, genenv_inline

from engine.coevolution import (
    CurriculumConfig,
    env_reward,
    in_band,
    in_band_share,
    load_config,
    recorded_run_config,
    score_groups,
    to_toml,
)
from engine.coevolution.sync import refill_shortfall
from engine.domains import Task, get_domain
from lake import CHECKPOINTS, Lake, read_pool, read_table, silver
from streams.events import RewardScored

# -- the alpha-curriculum ----------------------------------------------------------------------------


@pytest.mark.unit
def test_env_reward_peaks_at_alpha_and_falls_off_with_beta():
    config = CurriculumConfig(alpha=0.5, beta=10.0, k=0.1)
    assert env_reward(0.5, config) == 1.0
    assert env_reward(0.3, config) == pytest.approx(math.exp(-0.4))
    assert env_reward(0.0, config) == pytest.approx(math.exp(-2.5)) == pytest.approx(env_reward(1.0, config))
    assert in_band(0.4, config) and in_band(0.6, config) and not in_band(0.35, config)


@pytest.mark.unit
def test_a_lead_moves_the_reward_below_the_band_and_leaves_the_band_where_it_was():
    config = CurriculumConfig(alpha=0.5, beta=10.0, k=0.25, lead=0.2)
    assert env_reward(0.3, config) == 1.0
    assert env_reward(0.1, config) == pytest.approx(env_reward(0.5, config)) == pytest.approx(math.exp(-0.4))
    assert env_reward(0.0, config) > env_reward(1.0, config)
    assert in_band(0.25, config) and in_band(0.75, config) and not in_band(0.2, config)
    with pytest.raises(ValueError, match="alpha - lead"):
        CurriculumConfig(alpha=0.5, lead=0.6).check()


@pytest.mark.unit
def test_batch_and_task_granularity_on_hand_computed_groups():
    successes = {"a": [True, True, False, False], "b": [True, True, True, True], "c": []}  # c: an invalid task
    (batch,) = score_groups("b0", successes, CurriculumConfig(granularity="batch", beta=10, weight_temperature=0.5))
    assert (batch.p_hat, batch.n_rollouts, batch.n_success, batch.task_ids) == (0.75, 8, 6, ["a", "b"])
    assert batch.env_reward == pytest.approx(math.exp(-10 * 0.25**2)) and batch.filtered
    assert batch.weight == pytest.approx(math.exp(batch.env_reward / 0.5))
    a, b = score_groups("b0", successes, CurriculumConfig(granularity="task"))
    assert (a.batch_id, a.p_hat, a.env_reward, a.filtered) == ("b0:a", 0.5, 1.0, False)
    assert (b.batch_id, b.p_hat, b.filtered) == ("b0:b", 1.0, True)


@pytest.mark.unit
def test_level_granularity_pools_a_level_and_the_in_band_share_counts_tasks():
    """Two tasks of level 4, one all right and one all wrong, are each out of the band alone and in it together;
    a task of no known level is its own group; the share counts tasks, not groups."""
    successes = {"a": [True] * 4, "b": [False] * 4, "c": [True] * 4, "d": [True, False, False, False]}
    levels = {"a": 4, "b": 4, "c": 1}
    config = CurriculumConfig(granularity="level", k=0.25)
    four, one, own = score_groups("e0", successes, config, levels)
    assert (four.batch_id, four.task_ids, four.p_hat, four.filtered) == ("e0:level4", ["a", "b"], 0.5, False)
    assert (one.batch_id, one.p_hat, one.filtered) == ("e0:level1", 1.0, True)
    assert (own.batch_id, own.p_hat, own.filtered) == ("e0:d", 0.25, False)
    assert in_band_share([four, one, own]) == pytest.approx(3 / 4)
    assert in_band_share(score_groups("e0", successes, CurriculumConfig(granularity="task", k=0.25))) == 0.25
    with pytest.raises(ValueError, match="granularity must be one of batch, task, level"):
        CurriculumConfig(granularity="epoch").check()


@pytest.mark.unit
def test_the_warm_starts_seed_scores_never_take_the_names_of_epoch_0s_level_groups():
    """At level granularity an epoch's groups are named by the epoch ("{run}-e0:level2"). The seeds are scored in
    epoch 0 as well; when they were grouped by level too, their BatchScored events had epoch 0's identities, so
    epoch 0's own scores were quarantined as conflicting duplicates and the simulator's first RWR update had no
    rows. Each seed is its own group."""
    from engine.coevolution import GeneratedTask, Scorer, load_config

    config = load_config("quick", None, ["domain=toolcall", "curriculum.granularity=level"])
    domain = get_domain("toolcall")
    seeds = domain.seeds(random.Random(0), 8)
    scorer = Scorer(config, domain, "r1")

    def generated(batch: str, prefix: str, version: str) -> list[GeneratedTask]:
        return [GeneratedTask(f"{prefix}-t{i}", batch, "", t, p, version, 0) for i, (_, t, p) in enumerate(seeds)]

    seed_scores = scorer.seeds(generated("r1-seed", "r1-seed", "seed"))
    epoch_scores = scorer.groups(
        generated("r1-e0-b0", "r1-e0", "1"), {f"r1-e0-t{i}": [True, False] for i in range(8)}, 0
    )
    assert len(seed_scores) == 8 and all(s.n_tasks == 1 and s.granularity == "task" for s in seed_scores)
    assert {s.batch_id.split(":")[1] for s in epoch_scores} <= {f"level{i}" for i in range(8)}
    assert not {s.event_id for s in seed_scores} & {s.event_id for s in epoch_scores}
    assert not {s.batch_id for s in seed_scores} & {s.batch_id for s in epoch_scores}


@pytest.mark.unit
def test_dynamic_sampling_refills_only_up_to_the_groups_the_update_trains():
    """A refill round writes tasks for the mixed groups still missing: tasks_per_epoch of them, or agent.max_groups
    where that is set, since the update trains no more than that (a refill beyond it is rollouts nobody trains)."""

    def group(task_id: str, rewards: list[float]) -> list[RewardScored]:
        return [
            RewardScored(run_id="r", epoch=0, rollout_id=f"{task_id}-{i}", task_id=task_id, reward=x, success=x > 0)
            for i, x in enumerate(rewards)
        ]

    rewards = group("mixed-a", [1, 0]) + group("mixed-b", [0, 1]) + group("solved", [1, 1]) + group("failed", [0, 0])
    assert refill_shortfall(rewards, tasks_per_epoch=4, max_groups=0) == 2  # every group trains: two more wanted
    assert refill_shortfall(rewards, tasks_per_epoch=4, max_groups=3) == 1
    assert refill_shortfall(rewards, tasks_per_epoch=4, max_groups=2) == 0  # the update trains two; it has them
    assert refill_shortfall(rewards, tasks_per_epoch=1, max_groups=8) == 0


# -- the checkers --------------------------------------------------------------------------------------

MALICIOUS = [
    "__import__('os').system('touch {marker}')",
    "f\"{{__import__('os').system('touch {marker}')}}\"",
    "get_weather(city=__import__('os').system('touch {marker}'))",
    "get_weather(city=f\"{{__import__('os').system('touch {marker}')}}\")",
    "exec(\"open('{marker}', 'w')\")",
]


@pytest.mark.unit
@pytest.mark.parametrize("name", ["arith", "toolcall", "qa"])
def test_checkers_score_right_wrong_and_malicious_answers(name, tmp_path):
    domain = get_domain(name)
    tasks = domain.validation_set(5)
    for task in tasks:
        assert domain.check(task, domain.reference_answer(task)).success
    wrong = {
        "arith": lambda t: str(t.reference + 1),
        "toolcall": lambda t: domain.reference_answer(t).replace("(", "_x(", 1),
        "qa": lambda t: "I do not know",
    }[name]
    assert not any(domain.check(t, wrong(t)).success for t in tasks)
    marker = tmp_path / "pwned"
    for payload in MALICIOUS:
        verdict = domain.check(tasks[0], payload.format(marker=marker))
        assert verdict.reward < 0.5 and not verdict.success, (payload, verdict)
    assert not marker.exists(), "a generated answer was executed"


@pytest.mark.unit
def test_toolcall_applies_bfcl_rules():
    domain = get_domain("toolcall")
    tools = {"get_weather": __import__("engine.domains.toolcall", fromlist=["TOOLS"]).TOOLS["get_weather"]}
    task = Task(
        "weather in Oslo in fahrenheit",
        [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "fahrenheit"}}],
        tools=list(tools.values()),
    )
    assert domain.check(
        task, "get_weather(city='oslo.', unit='Fahrenheit')"
    ).success  # case and punctuation (BFCL's ,./-_*^)
    assert "Missing required parameter: 'city'" in domain.check(task, "get_weather(unit='fahrenheit')").detail
    assert (
        "Unexpected parameter: 'country'"
        in domain.check(task, "get_weather(city='Oslo', unit='fahrenheit', country='NO')").detail
    )
    assert "Expected type string, got int" in domain.check(task, "get_weather(city=3, unit='fahrenheit')").detail
    assert not domain.check(task, "get_weather(city='Oslo')").success  # the reference asks for fahrenheit
    default = Task(
        "weather in Oslo", [{"name": "get_weather", "arguments": {"city": "Oslo"}}], tools=list(tools.values())
    )
    assert domain.check(default, "get_weather(city='Oslo', unit='celsius')").success  # an optional at its default


@pytest.mark.unit
def test_parsers_record_why_a_generation_is_not_a_task():
    arith, toolcall, qa = get_domain("arith"), get_domain("toolcall"), get_domain("qa")
    assert arith.parse("What is 12 plus 30?", {}).reference == 42
    assert arith.parse("Subtract 4 from 10. What is left?", {}).reference == 6
    assert arith.parse("What is 3 plus?", {}).reason.startswith("numbers:")
    assert arith.parse("Tell me about 3 and 4.", {}).reason.startswith("operation:")
    request = toolcall.simulator_request(random.Random(0), "none")
    easy, *_, hard = request.context["candidates"]
    assert toolcall.parse("please help me with something", request.context).reason.startswith("no_choice")
    assert toolcall.parse("(a) please help me with something", request.context).reason.startswith("missing_value")
    call = easy["calls"][0]
    assert toolcall.parse(f"(a) {call['name']}(x) please", request.context).reason.startswith("leaks_call")
    values = " ".join(str(v) for c in hard["calls"] for v in c["arguments"].values())
    task = toolcall.parse(f"(d) Please do this: {values}", request.context)
    assert task.difficulty["level"] == hard["level"] and task.prompt == f"Please do this: {values}"
    # The letter names the task: the hardest one's values under the easiest one's letter are not its request.
    assert toolcall.parse(f"(a) Please do this: {values}", request.context).reason.startswith("missing_value")
    words = [v for c in easy["calls"] for v in c["arguments"].values() if isinstance(v, str) and len(v) >= 3]
    words = [
        w for w in words if w.lower() not in {str(v).lower() for c in hard["calls"] for v in c["arguments"].values()}
    ]
    assert words, easy  # the easy candidate names a city, a currency, a contact or a message of its own
    mixed = toolcall.parse(f"(d) Please do this: {values}, then {words[0]}", request.context)
    assert mixed.reason.startswith("ambiguous: the request also carries"), mixed
    context = {"subject": "France", "relation": "capital", "answer": "Paris", "tier": 0}
    assert qa.parse("Is Paris the capital of France?", context).reason.startswith("leaks_answer")
    assert qa.parse("What is the capital city of Spain?", context).reason.startswith("missing_subject")


# In a fresh interpreter that loads memory.py alone: a test process that has run models keeps freed memory in its
# heap, and a block taken from there neither raises its resident set nor lowers it when freed (CI read 2.47 GB both
# times). The block stays until the sampler has seen it, so a loaded machine that delays the thread cannot fail this.
PHASE_PEAKS_SCRIPT = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("memory", sys.argv[1])
memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory)
with memory.PhasePeaks(interval_s=0.01) as peaks:
    peaks.take()
    before = memory.resident_bytes()
    block = bytearray(512 * 2**20)  # zeroed pages are not resident until written
    block[::4096] = b"x" * (len(block) // 4096)
    deadline = time.monotonic() + 60
    while peaks._highest < before + 400 * 2**20 and time.monotonic() < deadline:
        time.sleep(0.01)
    del block  # a block this size is its own mapping: freed, it leaves the resident set
    large = peaks.take()
    small = peaks.take()
print(large, small)
"""


@pytest.mark.unit
def test_each_phase_reports_its_own_peak_rss_not_the_peak_so_far():
    memory = ROOT / "engine" / "coevolution" / "memory.py"
    done = subprocess.run(
        [sys.executable, "-c", PHASE_PEAKS_SCRIPT, str(memory)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    large, small = map(float, done.stdout.split())
    assert large - small > 0.4, (large, small)


# -- configuration -------------------------------------------------------------------------------------


@pytest.mark.unit
def test_config_layers_and_one_line_errors(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('domain = "qa"\nepochs = 3\n[agent]\nbeta = 0.04\n[curriculum]\nk = 0.2\n')
    config = load_config("quick", path, ["epochs=5", "agent.loss_type=dr_grpo"])
    assert (
        config.domain,
        config.epochs,
        config.agent_model,
        config.agent.beta,
        config.agent.loss_type,
        config.curriculum.k,
    ) == ("qa", 5, "tiny", 0.04, "dr_grpo", 0.2)
    for sets, message in [
        (["epochs=-1"], "epochs must be >= 0"),
        (["domain=chess"], "domain must be one of"),
        (["agent.loss_type=ppo"], "agent.loss_type=ppo: expected one of grpo"),
        (["curriculum.alpha=2"], "alpha must be in"),
        (["nope=1"], "no such option"),
        (["agent.nope=1"], "no such option"),
        (["group_size=1"], "group_size"),
        (["simulator_explore=1.5"], "simulator_explore must be in"),
        (["domain=arith", "simulator_explore=0.3"], "simulator_explore needs a domain"),
        (["env.temperature=0.5"], "env.temperature must equal the simulator's sampling temperature"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_config("quick", None, sets)
    bad = tmp_path / "bad.toml"
    bad.write_text("epochs = [")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config("quick", bad)


@pytest.mark.unit
def test_each_trainer_scores_at_the_temperature_its_role_samples_at():
    """GRPO's logprobs and RWR's likelihood are taken at the temperature the rollouts and the tasks were drawn at,
    which follows the run's options wherever they are set."""
    default = load_config("default")
    assert default.agent.temperature == default.env.temperature == default.temperature == 0.7
    hotter = load_config("default", None, ["simulator_temperature=1.0"])
    assert (hotter.agent.temperature, hotter.env.temperature) == (0.7, 1.0)
    both = load_config("default", None, ["temperature=0.9"])
    assert (both.agent.temperature, both.env.temperature) == (0.9, 0.9)
    assert load_config("quick").env.temperature == 1.0  # the profile samples at 1.0


@pytest.mark.unit
@pytest.mark.parametrize(
    "toml, message",
    [
        ("[curriculum]\nk = nan", "curriculum.k=nan: expected a finite number"),
        ("temperature = inf", "temperature=inf: expected a finite number"),
        ("[agent]\nlearning_rate = -inf", "agent.learning_rate=-inf: expected a finite number"),
        ("tasks_per_epoch = 9223372036854775807", "tasks_per_epoch=9223372036854775807: expected a number of"),
        ('epochs = "2"', "epochs=2: expected int, got the text '2'"),
        ('warm_start = "true"', "warm_start=true: expected bool"),
        ("rollout_workers = 10000", "rollout_workers must be at most"),
        ("max_model_len = 16", "max_model_len must exceed the longest answer"),
        ("x = " + "[" * 2000 + "]" * 2000, "nests its tables or arrays too deeply"),
    ],
)
def test_a_config_value_that_is_not_finite_bounded_and_typed_stops_with_its_name(toml, message, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(toml)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config("quick", path)


@pytest.mark.unit
@pytest.mark.parametrize("pair", ["curriculum.k=nan", "temperature=inf", "seed=99999999999999999999"])
def test_a_command_line_value_that_is_not_finite_or_bounded_stops_with_its_name(pair):
    with pytest.raises(ValueError, match=re.escape(pair.partition("=")[0])):
        load_config("quick", None, [pair])


@pytest.mark.unit
@pytest.mark.parametrize("profile", ["quick", "default", "paper"])
def test_a_config_reads_back_from_the_toml_it_writes(profile, tmp_path):
    """Quotes, backslashes, unicode, commas and edge spaces in strings, optional values unset: all round-trip."""
    config = dataclasses.replace(
        load_config(profile),
        agent_model='/models/a "quoted" \\ back\\slash ünïcode ☃',
        env_model="  C:\\models\\spaced, comma\ttab  ",
        run_id="run-1.a_b",
    )
    config = dataclasses.replace(config, agent=dataclasses.replace(config.agent, epsilon_high=None))
    path = tmp_path / "run.toml"
    path.write_text(to_toml(config))
    assert load_config("default", path) == config
    path.write_text(to_toml(dataclasses.replace(config, agent=dataclasses.replace(config.agent, epsilon_high=0.28))))
    assert load_config("default", path).agent.epsilon_high == 0.28


@pytest.mark.unit
@pytest.mark.parametrize("run_id", ["a/b", "..", "../../etc/passwd", ".hidden", 'q"uote', "x" * 129])
def test_a_run_id_that_cannot_name_its_config_file_is_refused(run_id, tmp_path):
    """A run id names <lake>/runs/<run id>.toml; run ids in the lake are a producer's text, never a path to follow."""
    with pytest.raises(ValueError, match="run id"):
        load_config("quick", None, [f"run_id={run_id}"])
    with pytest.raises(ValueError, match="run id"):
        recorded_run_config(Lake(tmp_path), run_id)
    assert load_config("quick", None, ["run_id=toolcall-genenv-s1.v2_a"]).run_id == "toolcall-genenv-s1.v2_a"


@pytest.mark.integration
def test_genenv_run_stops_on_a_bad_value_before_any_work(tmp_path):
    lake = tmp_path / "lake"
    for args, message in [
        (["--epochs", "0"], "epochs = 0 (until stopped) is for async runs"),
        (["--epochs", "-1"], "epochs must be >= 0"),
        (["--domain", "chess"], "domain must be one of"),
        (["--profile", "huge"], "profile must be one of"),
        (["--set", "agent.epsilon=-1"], "epsilon"),
        (["--set", "guidance=-1"], "guidance must be >= 0"),
        (["--domain", "world", "--set", "guidance=2"], "guidance is for single-turn domains"),
        (["--async", "--set", "guidance=2"], "guidance is for the sync loop"),
    ]:
        result = genenv_inline("run", "--lake", str(lake), *args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert result.stderr.strip().count("\n") == 0
    # a worker started by hand for an async run is refused guidance too (check_async), before it opens the lake
    result = genenv_inline("worker", "reward", "--run-id", "r1", "--lake", str(lake), "--set", "guidance=2")
    assert result.returncode == 2 and "guidance is for the sync loop" in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert not lake.exists()


# -- a quick run, end to end -----------------------------------------------------------------------------


# (the quick_run fixture is in conftest.py: test_audit.py audits and replays the same run)


@pytest.mark.e2e
def test_a_quick_run_leaves_every_kind_of_record_in_the_lake(quick_run):
    lake, stdout = quick_run
    tasks = read_table(lake, silver("task"))
    assert tasks.height > 0 and {"0", "1", "seed"} & set(tasks["env_model_version"].to_list())
    generated = tasks.filter(pl.col("producer") != "warm-start")
    assert generated.height >= 2 * 4, "every generation is recorded, parseable or not"
    assert (generated["valid"] | generated["invalid_reason"].is_not_null()).all()
    report = next((Path(lake.root) / "reports").iterdir())
    metrics = json.loads((report / "metrics.json").read_text())
    refilled = {m["epoch"]: m["refilled_tasks"] for m in metrics["epochs"]}
    for epoch in (0, 1):  # the simulator writes until it has tasks_per_epoch valid tasks (or runs out of attempts)
        of_epoch = generated.filter(pl.col("epoch") == epoch)
        first_round = of_epoch["valid"].sum() - refilled[epoch]
        assert first_round <= 4
        assert first_round == 4 or of_epoch.height >= 4 + 3, "four attempts before giving up"
    # Dynamic sampling: the tiny agent's groups are mostly alike (all wrong), so the run wrote tasks in their place
    # (an epoch whose groups were mixed enough, or whose refill parsed nothing, has none).
    assert any(refilled.values()) and all(0 <= n <= 4 for n in refilled.values()), refilled
    for kind in ("rollout", "reward", "batch"):
        assert read_table(lake, silver(kind)).height > 0, kind
    # Guidance (the fixture's guidance 2): the reference answer joins up to two groups an epoch whose rollouts all
    # failed, scored by the checker (arith's references are right), and the agent's updates train those groups.
    rewards = read_table(lake, silver("reward"))
    own = rewards.filter(pl.col("producer") != "guidance")
    guides = rewards.filter(pl.col("producer") == "guidance")
    assert guides.height > 0 and guides["success"].all() and guides["rollout_id"].str.ends_with("-guide").all()
    for epoch, of_epoch in guides.group_by("epoch"):
        assert of_epoch.height <= 2, epoch
    assert not own.filter(pl.col("task_id").is_in(guides["task_id"].implode()))["success"].any()
    trained = read_pool(lake, "d_train").filter(pl.col("rollout_id").str.ends_with("-guide"))
    assert trained.height == guides.height and (trained["group_index"] == 4).all()  # the quick profile's G = 4
    checkpoints = read_table(lake, CHECKPOINTS)
    assert {"agent", "env"} <= set(checkpoints["model_kind"].to_list())
    assert read_pool(lake, "d_train").height > 0 and read_pool(lake, "d_env").height > 0
    for name in ("report.md", "success.png", "validation.png", "difficulty.png", "metrics.json", "config.toml"):
        assert (report / name).is_file(), name
    assert len(metrics["epochs"]) == 3  # the quick_run fixture runs three epochs
    # What the run taught: steps, the whole set before and after (same items) and the paired interval of the gain.
    assert metrics["agent_optimizer_steps"] > 0 and metrics["validation_items"] == 6
    low, high = metrics["validation_gain_interval"]
    assert low <= metrics["validation_gain"] <= high
    # (the accuracies are rounded to 4 places, the gain is the exact mean of the item-by-item differences)
    assert metrics["validation_gain"] == pytest.approx(
        metrics["validation_after"] - metrics["validation_before"], abs=1e-3
    )
    assert (report / "learning.png").is_file() and metrics["phases"]["warm_start"]["peak_rss_gb"] > 0
    # The items behind those figures: each held-out item's answers before and after, with the checker's verdicts.
    answers = [json.loads(line) for line in (report / "validation.jsonl").read_text().splitlines()]
    assert [a["item"] for a in answers] == list(range(6))
    for when in ("before", "after"):
        assert all(isinstance(a[when]["answer"], str) and a[when]["detail"] for a in answers)
        assert sum(a[when]["success"] for a in answers) / 6 == pytest.approx(metrics[f"validation_{when}"], abs=1e-3)
    # what the run's dtype resolved to: the quick profile pins fp32, so it is fp32 on every CPU (on one with native
    # bf16 this test once expected the default's bf16, and failed there)
    assert metrics["precision"] == {"device": "cpu", "dtype": "fp32"}


@pytest.mark.e2e
def test_every_p_hat_and_env_reward_can_be_recomputed_from_its_rows(quick_run):
    lake, _ = quick_run
    config = load_config("quick")
    rewards = read_table(lake, silver("reward")).filter(pl.col("producer") != "guidance")  # the agent's own
    success = {}
    for row in rewards.iter_rows(named=True):
        success.setdefault(row["task_id"], []).append(row["success"])
    batches = read_table(lake, silver("batch"))
    assert batches.height > 0
    for batch in batches.iter_rows(named=True):
        outcomes = [s for task_id in batch["task_ids"] for s in success[task_id]]
        assert batch["n_rollouts"] == len(outcomes) and batch["n_success"] == sum(outcomes)
        assert batch["p_hat"] == pytest.approx(sum(outcomes) / len(outcomes))
        assert batch["env_reward"] == pytest.approx(env_reward(batch["p_hat"], config.curriculum))
        assert batch["filtered"] == (not in_band(batch["p_hat"], config.curriculum))
    d_env = read_pool(lake, "d_env")
    by_batch = {t: b for b in batches.iter_rows(named=True) for t in b["task_ids"]}
    for row in d_env.iter_rows(named=True):
        assert row["p_hat"] == by_batch[row["task_id"]]["p_hat"]
        # what RWR scores each generation at, recorded where it was sampled (seed tasks were not)
        generated = row["env_model_version"] != "seed"
        assert row["temperature"] == (config.simulator_sampling_temperature if generated else None)


@pytest.mark.e2e
def test_a_manual_update_after_a_warm_start_takes_the_options_of_the_run_that_made_it(quick_run, broker, tmp_path):
    """`genenv train env` from the simulator's warm start (no update in its lineage to inherit from) continues the
    run: the simulator options its recorded configuration holds, where it took RWRConfig's defaults before (and so
    scored a default run's generations at 1.0, sampled at 0.7). The quick profile samples at 1.0, the default's
    temperature, so its learning rate and batch are what tell the two apart here."""
    import shutil

    from trainers import RWRConfig, manifest, registry

    lake, _ = quick_run
    copy = Lake(shutil.copytree(lake.root, tmp_path / "lake"), create=False)
    checkpoints = registry(copy, "env")
    (warm,) = [v for v in checkpoints["version"] if manifest(copy, "env", v)["metrics"].get("warm_start")]
    run_id = checkpoints.filter(pl.col("version") == warm)["run_id"].item()
    options = recorded_run_config(copy, run_id).env
    assert options != RWRConfig()  # the quick profile's learning rate and batch: a test that can tell them apart
    # the quick run's rows are out of its band by now: band_only=false gives this update rows to train on
    sets = ["--set", "seed=5", "--set", "band_only=false"]
    result = genenv_cli(
        "train", "env", "--lake", copy.root, "--parent", str(warm), "--bootstrap", broker.bootstrap, *sets
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"options: those of run {run_id}'s configuration, with --set" in result.stdout
    (written,) = [
        p
        for p in (Path(copy.root) / "checkpoints" / "env").iterdir()
        if p.name not in {f"v{v}" for v in checkpoints["version"]}
    ]
    lineage = json.loads((written / "genenv.json").read_text())
    assert lineage["parent_version"] == warm
    recorded = json.loads(json.dumps(dataclasses.asdict(options)))
    assert lineage["config"] == {**recorded, "seed": 5, "band_only": False}


@pytest.mark.unit
def test_toolcall_seeds_can_come_from_api_bank():
    from conftest import ROOT

    data = ROOT / "data" / "api-bank"
    domain = get_domain("toolcall", str(data))
    seeds = domain.seeds(random.Random(0), 20)
    assert len(seeds) == 20 and len(domain.seed_file) > 300
    for _request, text, task in seeds:
        assert text == f"(a) {task.prompt}" and domain.check(task, domain.reference_answer(task)).success
    with pytest.raises(ValueError, match="does not exist"):
        get_domain("toolcall", str(data / "missing.json"))


@pytest.mark.unit
def test_the_toolcall_warm_start_picks_each_letter_equally_often_in_a_seeded_order():
    """A warm start that picked at random taught the simulator the letter its draw held most (seed 2's 24 seeds
    held (a) 10 times); every run's seeds now hold each letter n / 4 times, in an order the seed decides, and each
    seed is a valid task whose letter names the candidate it is."""
    from engine.domains.toolcall import CHOICES, letter

    toolcall = get_domain("toolcall")
    names = [letter(i) for i in range(CHOICES)]  # the form the simulator's menu names its candidates in
    orders = []
    for seed in range(5):
        seeds = toolcall.seeds(random.Random(seed + 7919), 24)
        letters = [text[:3] for _request, text, _task in seeds]
        assert Counter(letters) == dict.fromkeys(names, 6), (seed, Counter(letters))
        for request, text, task in seeds:  # the letter names the candidate whose calls the task's reference is
            assert isinstance(task, Task), (text, task)
            assert request.context["candidates"][names.index(text[:3])]["calls"] == task.reference
        orders.append(letters)
    assert len({tuple(o) for o in orders}) == 5
    assert [t for _, t, _ in toolcall.seeds(random.Random(3), 24)] == [
        t for _, t, _ in toolcall.seeds(random.Random(3), 24)
    ]


@pytest.mark.unit
def test_toolcall_levels_climb_a_ladder_and_the_candidates_span_it():
    """Each level adds what makes a call harder (parallel calls, distractors from API-Bank's catalogue, values
    said in words), the simulator is offered one candidate from each quarter of the range, and a request that
    says a value in words is parsed to its candidate while the agent must still write the call's form."""
    import random

    from engine.domains.toolcall import BANDS, LEVELS, TOOLS, catalogue, spoken

    toolcall = get_domain("toolcall")
    assert len(catalogue()) >= 40  # data/api-bank's API descriptions
    for seed in range(20):
        request = toolcall.simulator_request(random.Random(seed), "none")
        assert all(low <= level <= high for level, (low, high) in zip(request.offered, BANDS))
    tasks = toolcall.validation_set(2 * len(LEVELS))
    for task in tasks:
        parallel, _, distractors, said = LEVELS[task.difficulty["level"]]
        assert task.difficulty["parallel_calls"] == parallel and task.difficulty["distractors"] == distractors
        assert toolcall.check(task, toolcall.reference_answer(task)).success
    hardest = [t for t in tasks if t.difficulty["level"] == len(LEVELS) - 1]
    assert all(any(tool["name"] not in TOOLS for tool in t.tools) for t in hardest)  # API-Bank distractors
    # A spoken-form level: the request says 'euros' (or 'seven'), the call takes 'EUR' (or 7).
    worded = [
        t
        for t in tasks
        if LEVELS[t.difficulty["level"]][3]
        and any(spoken(v) != str(v) for c in t.reference for v in c["arguments"].values())
    ]
    assert worded
    for task in worded:
        call = next(c for c in task.reference if any(spoken(v) != str(v) for v in c["arguments"].values()))
        name, value = next((k, v) for k, v in call["arguments"].items() if spoken(v) != str(v))
        assert spoken(value).lower() in task.prompt.lower()
        literal = toolcall.reference_answer(task).replace(repr(value), repr(spoken(value)), 1)
        assert not toolcall.check(task, literal).success, (name, value, literal)
    # The simulator may write the words too: the parser finds the candidate from them.
    request = toolcall.simulator_request(random.Random(3), "none")
    top = request.context["candidates"][-1]
    text = "(d) Please: " + " ".join(spoken(v) for c in top["calls"] for v in c["arguments"].values())
    assert toolcall.parse(text, request.context).difficulty["level"] == top["level"]


@pytest.mark.unit
def test_an_explored_request_admits_only_the_drawn_choice_and_offers_only_its_level():
    """simulator_explore: in genenv mode that share of the simulator's requests has its choice drawn by the run, the
    grammar admitting that candidate's letter alone and the request offering its level alone (so the selection bias
    counts it as no choice); the candidates are the ones the same requests would offer without it. The untrained
    simulator of genenv-random is never steered: its choices are the baseline's."""
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from engine.coevolution.roles import Simulator
    from engine.domains.toolcall import letter, template_text

    domain = get_domain("toolcall")
    free, fixed = (domain.simulator_request(random.Random(5), "none", choice=c) for c in (None, 2))
    assert fixed.context == free.context and fixed.prompt == free.prompt
    candidates = fixed.context["candidates"]
    assert fixed.offered == [candidates[2]["level"]] and len(free.offered) == 4
    texts = [f"{letter(i)} {template_text(random.Random(1), spec)}" for i, spec in enumerate(candidates)]
    assert [accepts(fixed.grammar, t) for t in texts] == [False, False, True, False]
    assert all(accepts(free.grammar, t) for t in texts)

    def offered(mode: str, share: float) -> list[int]:
        config = load_config("quick", None, [f"mode={mode}", f"simulator_explore={share}", "domain=toolcall"])
        simulator = Simulator(config, domain, "r")
        return [len(simulator.request("none", 0, 0, 0, i).offered) for i in range(200)]

    assert offered("genenv", 1.0) == [1] * 200 and offered("genenv", 0.0) == [4] * 200
    assert 70 <= offered("genenv", 0.5).count(1) <= 130
    assert offered("genenv-random", 1.0) == [4] * 200


@pytest.mark.unit
def test_the_requests_the_seeds_teach_are_the_request_grammars_form():
    """The simulator is warm-started on `template_text` requests after their candidate's letter and then generates
    under `request_grammar`: every seed request is inside the grammar (the letter, one candidate's calls in its
    templates, a value in either form, what the templates leave out in a closing parenthesis), and nothing else
    is: a request with a word of its own, a spelled-out call, a value missing, another candidate's value, another
    candidate's letter, no letter."""
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from engine.domains.toolcall import letter, template_text

    domain, rng = get_domain("toolcall"), random.Random(0)
    refused = []
    for _ in range(100):
        request = domain.simulator_request(rng, "none yet")
        for i, spec in enumerate(request.context["candidates"]):
            text = f"{letter(i)} {template_text(rng, spec)}"
            if not accepts(request.grammar, text):
                refused.append(text)
    assert not refused, refused
    spec, other = request.context["candidates"][:2]
    good = f"(a) {template_text(rng, spec)}"
    assert accepts(request.grammar, good)
    call = spec["calls"][0]
    first = str(next(iter(call["arguments"].values())))
    refusals = [
        good.replace("(a) ", "(a) Please: "),
        good.replace("(a) ", "(b) "),
        good.replace("(a) ", ""),
        good + f" {call['name']}(x=1)",
        good.replace(first, "").replace(first.lower(), ""),
        good.rstrip(".?!") + f" and {next(iter(other['calls'][0]['arguments'].values()))}.",
    ]
    assert not [text for text in refusals if accepts(request.grammar, text)]


@pytest.mark.unit
@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_file_in_configs_loads_and_says_what_it_is_for(path):
    assert path.read_text().startswith("#"), "a config file opens with a comment saying what it is for"
    for profile in ("default", "paper"):
        load_config(profile, path)
