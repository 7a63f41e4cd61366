"""The world domain's text world (engine/domains/world.py): what the simulator may write, the turns an agent plays
in it, and the shortest solution that sets a world's difficulty."""

from __future__ import annotations

import json
import random

import polars as pl
import pytest

from engine.coevolution import load_config
from engine.coevolution.roles import GeneratedTask, Rollouts
from engine.domains.base import Invalid
from engine.domains.world import NOTHING, OBJECTS, Episode, Room, parse_world, replay, solve
from engine.domains.world import World as WorldDomain
from trainers import GRPOConfig, GRPOTrainer, load_model
from trainers.grpo import select_rows

CLEAN_MUG = (
    "task: clean some mug and put it in cabinet. mug 1 is in fridge 1. fridge 1 is closed.\n"
    "apple 1 is on countertop 1. cabinet 1 is closed."
)


def world(text: str) -> Room:
    parsed = parse_world(text)
    assert isinstance(parsed, Room), parsed
    return parsed


@pytest.mark.unit
def test_a_world_has_the_rooms_its_sentences_name_and_the_appliance_its_goal_needs():
    w = world(CLEAN_MUG)
    assert w.receptacles == ("cabinet 1", "countertop 1", "fridge 1", "sinkbasin 1")  # the sink: the goal cleans
    assert w.task() == "Your task is to: clean some mug and put it in cabinet."
    assert w.intro().endswith("you see a cabinet 1, a countertop 1, a fridge 1, and a sinkbasin 1.")
    assert w.opened == frozenset()  # both openable receptacles were said closed
    assert world("task: put some egg in shelf. egg 1 is in drawer 1.").opened == {"drawer 1"}  # not said closed


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("mug 1 is in fridge 1.", "no_goal"),
        ("task: put some mug in shelf. task: put some egg in shelf. mug 1 is on shelf 1.", "no_goal"),
        ("task: put some unicorn in shelf. mug 1 is on countertop 1.", "unknown_name"),
        ("task: put some mug in shelf. mug 1 is in wardrobe 1.", "unknown_name"),
        ("task: put some mug in shelf. mug 1 is on countertop 1. mug 1 is on shelf 1.", "placed_twice"),
        ("task: put some mug in shelf. mug 1 is on fridge 1.", "wrong_preposition"),
        ("task: put some mug in shelf. mug 1 is on countertop 1. countertop 1 is closed.", "not_openable"),
        ("task: put some mug in shelf. import os; os.system('rm -rf /')", "unreadable"),
        ("task: put some mug in shelf.", "no_objects"),
    ],
)
def test_what_is_not_a_world_is_invalid_with_its_reason(text, reason):
    parsed = parse_world(text)
    assert isinstance(parsed, Invalid) and parsed.reason.startswith(reason + ":"), parsed


@pytest.mark.unit
def test_the_shortest_solution_is_found_and_its_length_is_the_difficulty():
    assert solve(world(CLEAN_MUG)) == [
        "go to fridge 1",
        "open fridge 1",
        "take mug 1 from fridge 1",
        "go to sinkbasin 1",
        "clean mug 1 with sinkbasin 1",
        "go to cabinet 1",
        "open cabinet 1",
        "move mug 1 to cabinet 1",
    ]
    assert len(solve(world("task: put some mug in shelf. mug 1 is on countertop 1."))) == 4  # go, take, go, move
    assert solve(world("task: put some egg in shelf. mug 1 is on countertop 1.")) is None  # no egg: unsolvable
    assert solve(world("task: put some mug in shelf. mug 1 is on shelf 1.")) == []  # already done


@pytest.mark.unit
def test_a_turn_takes_only_an_admissible_command_and_a_trajectory_replays_to_the_same_observations():
    start = world(CLEAN_MUG)
    assert start.admissible() == [
        "go to cabinet 1",
        "go to countertop 1",
        "go to fridge 1",
        "go to sinkbasin 1",
        "inventory",
        "look",
    ]
    same, feedback = start.step("take mug 1 from fridge 1")  # not here, and the fridge is closed
    assert same == start and feedback == "Nothing happens."
    at_fridge, feedback = start.step("go to fridge 1")
    assert feedback == "You arrive at fridge 1. The fridge 1 is closed."
    assert "take mug 1 from fridge 1" not in at_fridge.admissible() and "open fridge 1" in at_fridge.admissible()
    _, feedback = at_fridge.step("open fridge 1")
    assert feedback == "You open the fridge 1. The fridge 1 is open. In it, you see a mug 1."

    trajectory = ["go to fridge 1", "open fridge 1", "take mug 1 from fridge 1", "go to cabinet 1", "open cabinet 1"]
    trajectory += ["move mug 1 to cabinet 1"]  # not cleaned first: the goal is not reached
    task = WorldDomain().parse(CLEAN_MUG, {})

    def played(commands: list[str]) -> tuple[list[tuple[str, str]], bool]:
        episode = replay(Episode(task), commands)
        return episode.turns, episode.won

    turns, won = played(trajectory)
    assert not won and [c for c, _ in turns] == trajectory
    assert played(trajectory) == (turns, won)  # deterministic: the commands are the trajectory
    turns, won = played(solve(start) + ["look"])
    assert won and len(turns) == 8  # the episode ends at the goal


# -- the domain, the turn loop and GRPO over trajectories ----------------------------------------------------------


@pytest.mark.unit
def test_the_domains_seeds_are_tasks_in_the_request_grammar_whose_reference_solves_them():
    from xgrammar.testing import _is_grammar_accept_string as accepts

    domain = WorldDomain()
    seeds = domain.seeds(random.Random(0), 24)
    for request, text, task in seeds:
        assert accepts(request.grammar, text), text  # what the warm start teaches is what the grammar allows
        assert task.difficulty["level"] == len(task.reference["solution"]) >= 1
        assert domain.check(task, domain.reference_answer(task)).success
        assert not domain.check(task, "look\ninventory").success
    assert len({t.difficulty["level"] for _, _, t in seeds}) >= 3  # the seeds span levels
    request = domain.simulator_request(random.Random(1), "no results yet")
    stranger = next(o for o in OBJECTS if o not in request.context["objects"])
    text = f"task: put some {stranger} in shelf. {stranger} 1 is on countertop 1."
    assert domain.parse(text, request.context).reason.startswith("not_offered:")
    assert domain.parse("task: put some egg in shelf. mug 1 is on countertop 1.", {}).reason.startswith("unsolvable:")
    assert domain.parse("task: put some mug in shelf. mug 1 is on shelf 1.", {}).reason.startswith("already_done:")


def tiny_rollouts(group_size: int = 2) -> Rollouts:
    config = load_config("quick", None, ["domain=world", f"group_size={group_size}", "agent_max_new_tokens=6"])
    rollouts = Rollouts(config, WorldDomain(), "run")
    rollouts.model = load_model("tiny", seed=0)
    return rollouts


@pytest.mark.unit
def test_a_rollout_is_a_trajectory_of_turns_that_replays_to_its_verdict():
    domain, rollouts = WorldDomain(), tiny_rollouts()
    tasks = [
        GeneratedTask(f"t{i}", "b", "", text, task, "seed", 0)
        for i, (_, text, task) in enumerate(domain.seeds(random.Random(2), 2))
    ]
    events = rollouts.roll_out(tasks, epoch=0)
    assert [e.rollout_id for e in events] == ["t0-r0", "t0-r1", "t1-r0", "t1-r1"]
    for event in events:
        turns = json.loads(event.turns_json)
        task = next(t.parsed for t in tasks if t.task_id == event.task_id)
        assert 1 <= len(turns) <= domain.max_turns
        assert event.completion == "\n".join(t["command"] for t in turns)
        assert event.completion_token_ids == [i for t in turns for i in t["token_ids"]]
        assert len(event.behaviour_logprobs) == len(event.completion_token_ids)
        for before, after in zip(turns, turns[1:]):  # each turn's prompt shows what the last one's command did
            assert f"Now: {before['observation']}" in after["prompt"]
        if len(turns) < domain.max_turns:  # an episode ends early only at its goal, and its replay says so
            assert domain.check(task, event.completion).success and turns[-1]["observation"] != NOTHING
    again = rollouts.roll_out(tasks, epoch=0)
    assert [(e.completion, e.turns_json) for e in again] == [(e.completion, e.turns_json) for e in events]

    reference = rollouts.reference_turns(tasks[0].parsed)
    assert [t["command"] for t in reference] == tasks[0].parsed.reference["solution"]
    assert domain.check(tasks[0].parsed, "\n".join(t["command"] for t in reference)).success


@pytest.mark.unit
def test_grpo_trains_a_trajectory_on_its_agents_tokens_only_with_its_one_advantage():
    """The environment's words are in each turn's prompt, never in a completion: the micro-batches' completion
    tokens are exactly the turns' reply tokens, and every turn of a trajectory carries that trajectory's advantage."""
    domain, rollouts = WorldDomain(), tiny_rollouts(group_size=2)
    ((_, text, task),) = domain.seeds(random.Random(3), 1)
    events = rollouts.roll_out([GeneratedTask("t0", "b", "", text, task, "seed", 0)], epoch=0)
    rows = pl.DataFrame(
        [
            {
                **{k: getattr(e, k) for k in ("rollout_id", "task_id", "group_index", "prompt", "completion")},
                "agent_model_version": "0",
                "completion_token_ids": e.completion_token_ids,
                "behaviour_logprobs": e.behaviour_logprobs,
                "turns_json": e.turns_json,
                "reward": float(i == 0),
            }
            for i, e in enumerate(events)
        ]
    )
    config = GRPOConfig(per_device_train_batch_size=3, filter_groups=False, temperature=rollouts.config.temperature)
    selected, _ = select_rows(rows, 0, config)
    batches = GRPOTrainer(rollouts.model.model, rollouts.model.tokenizer, config).micro_batches(selected)
    trained: list[tuple[tuple[int, ...], float]] = []
    for mb in batches:
        for ids, mask, advantage in zip(mb.tokens.completion_ids, mb.tokens.completion_mask, mb.advantages):
            trained.append((tuple(ids[mask.bool()].tolist()), round(float(advantage), 6)))
    turns = [json.loads(e.turns_json) for e in events]
    expected = [(tuple(t["token_ids"]), sign) for ts, sign in zip(turns, (1.0, -1.0)) for t in ts]
    assert sorted((ids, advantage > 0) for ids, advantage in trained) == sorted(
        (ids, sign > 0) for ids, sign in expected
    )
    assert len({advantage for _, advantage in trained}) == 2  # one advantage a trajectory

    # A producer's turns_json that cannot be trained from is left out with its reason, not trained as one turn.
    broken = rows.with_columns(pl.Series("turns_json", ['[{"prompt": "p", "token_ids": [1]}]', "not json"]))
    kept, dropped = select_rows(broken, 0, config)
    assert kept.height == 0 and dropped == {"unreadable_turns": 2}


@pytest.mark.e2e
def test_a_world_run_plays_trajectories_that_audit_shows_and_replay_reproduces_bit_for_bit(tmp_path):
    """`genenv run --domain world` end to end (the domain's seed worlds, so that a tiny agent has valid tasks to
    play): every rollout in the lake is a trajectory, the audit shows its turns, and the replay of the epoch
    retrains its multi-turn GRPO update bit for bit."""
    from conftest import genenv_cli, genenv_inline

    from lake import Lake, read_table, silver

    lake = tmp_path / "lake"
    run = genenv_cli(
        "run", "--profile", "quick", "--domain", "world", "--mode", "seeds-only", "--epochs", "1",
        "--lake", str(lake), "--report", str(tmp_path / "report"),
        "--set", "warm_start_epochs=5", "--set", "agent_max_new_tokens=6", "--set", "tasks_per_epoch=2",
        "--set", "batch_size=2", "--set", "group_size=2", "--set", "refill_rounds=0", "--set", "validation_size=2",
        "--set", "validation_subset=0", timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (tmp_path / "report" / "report.md").exists()
    rollouts = read_table(Lake(lake, create=False), silver("rollout"))
    played = rollouts.filter(pl.col("agent_model_version") != "seed")
    assert played.height == 2 * 2  # 2 tasks x G = 2, each a trajectory
    assert all(json.loads(t) for t in played["turns_json"])
    task_id = played["task_id"][0]
    audit = genenv_inline("audit", "task", task_id, "--lake", str(lake), "--json")
    shown = json.loads(audit.stdout[audit.stdout.index("{") :])
    assert all(r["turns"] and r["turns"][0]["command"] for r in shown["rollouts"])

    replay = genenv_cli("replay", "--epoch", "0", "--lake", str(lake), "--json", timeout=600)
    assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-2000:]
    answer = json.loads(replay.stdout[replay.stdout.index("{") :])
    assert answer["ok"] and any(c["kind"] == "agent" for c in answer["checkpoints"])
    for c in answer["checkpoints"]:
        assert c["replayed_sha256"] == c["recorded_sha256"], c


@pytest.mark.unit
def test_the_warm_start_trains_a_seed_trajectory_as_its_turns_and_leaves_out_one_it_cannot_read():
    from trainers.update import SEED_VERSION, warm_start_rows

    turn = {"prompt": "look around", "completion": "go to fridge 1", "token_ids": [5, 6], "logprobs": [0.0, 0.0]}
    rows = pl.DataFrame(
        {
            "rollout_id": ["a", "b", "c"],
            "agent_model_version": [SEED_VERSION] * 3,
            "prompt": ["2+2?", "world b", "world c"],
            "completion": ["4", "go to fridge 1", "never trained"],
            "turns_json": ["", json.dumps([turn]), "not json"],
        }
    )
    pairs = warm_start_rows("agent", rows)
    assert sorted(zip(pairs["prompt"], pairs["text"])) == [("2+2?", "4"), ("look around", "go to fridge 1")]
