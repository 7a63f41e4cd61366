"""The world domain's text world (engine/domains/world.py): what the simulator may write, the turns an agent plays
in it, and the shortest solution that sets a world's difficulty."""

from __future__ import annotations

import pytest

from engine.domains.base import Invalid
from engine.domains.world import Room, parse_world, play, solve

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
    observations, won = play(start, trajectory)
    assert not won and len(observations) == len(trajectory)
    assert play(start, trajectory) == (observations, won)  # deterministic: the commands are the trajectory
    observations, won = play(start, solve(start) + ["look"])
    assert won and len(observations) == 8  # the episode ends at the goal
