"""What a domain is: seeds, the simulator's prompt, the parser of its generations, the agent's prompt, the checker.

The domain owns the truth. The simulator writes the *text* of a task; the domain's parser reads
what the text asks (with regular expressions, `ast` or JSON, never eval) and computes or checks
the reference itself, so a small simulator can do its job: a generation the parser cannot read
becomes an invalid task with the reason, never a task with a wrong answer key.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Task:
    prompt: str  # what the agent is asked (the user message)
    reference: Any  # JSON-able: what the checker compares against
    difficulty: dict[str, float] = field(default_factory=dict)
    tools: list[dict] = field(default_factory=list)  # tool schemas offered to the agent (toolcall)


@dataclass
class Invalid:
    reason: str  # why the generation is not a task, e.g. "no_numbers: ..."


@dataclass
class Verdict:
    reward: float  # in [0, 1]
    success: bool
    detail: str  # why, for audits


@dataclass
class SimulatorRequest:
    """One prompt for the simulator, with what the domain fixed for it (the parser gets it back)."""

    prompt: str
    context: dict = field(default_factory=dict)
    offered: list[float] = field(default_factory=list)  # the difficulty_feature values the simulator may choose from
    # An EBNF grammar (xgrammar's dialect, GBNF-like) the simulator's output is constrained to, where the domain fixes
    # part of its form; "" leaves it free. The parser still judges the text: a grammar only makes validity likelier.
    grammar: str = ""


class Domain(Protocol):
    name: str
    agent_system: str  # the agent's system prompt
    # Optional: `agent_stop`, strings that end an agent's answer where they first appear (trainers.cut_at_stop), for
    # a domain whose answer has a form that says where it is complete (toolcall: a blank line after the calls).

    # A domain whose request offers a choice of candidates (toolcall) also has `choices` (how many) and takes
    # simulator_request(..., choice=i), whose grammar admits candidate i alone: the run's exploration,
    # RunConfig.simulator_explore, which is refused at config time for a domain without them.
    def simulator_request(self, rng: random.Random, performance: str) -> SimulatorRequest: ...

    def parse(self, generation: str, context: dict) -> Task | Invalid: ...

    def seeds(self, rng: random.Random, n: int) -> list[tuple[SimulatorRequest, str, Task]]:
        """n seed tasks: the simulator request, the text a good simulator would write for it, the task."""
        ...

    def reference_answer(self, task: Task) -> str: ...

    def agent_prompt(self, task: Task) -> str: ...

    def check(self, task: Task, answer: str) -> Verdict: ...

    def validation_set(self, n: int) -> list[Task]:
        """A fixed held-out set, drawn from its own random stream, never used for training."""
        ...


def multi_turn(domain) -> bool:
    """Whether the agent plays the domain's tasks over turns: a domain that does sets `max_turns` and has `episode`
    (domains/world.py)."""
    return bool(getattr(domain, "max_turns", 0))


def performance_summary(rows: list[tuple[dict, bool]], feature: str) -> str:
    """The agent's recent success by one difficulty feature, as the simulator's prompt shows it."""
    by_level: dict[Any, list[bool]] = {}
    for difficulty, success in rows:
        by_level.setdefault(difficulty.get(feature), []).append(success)
    if not by_level:
        return "no results yet"
    parts = [
        f"{feature} {level}: {sum(s) / len(s):.0%} of {len(s)}"
        for level, s in sorted(by_level.items(), key=lambda kv: str(kv[0]))
    ]
    return ", ".join(parts)


def example_summary(rng: random.Random, feature: str, levels: list) -> str:
    """A made-up performance summary for a seed's simulator prompt: the warm start then teaches the
    simulator to write tasks whatever the summary says, instead of only after "no results yet"."""
    if rng.random() < 0.25:
        return "no results yet"
    rows = [({feature: level}, rng.random() < rng.random()) for level in levels for _ in range(rng.randint(1, 6))]
    return performance_summary(rows, feature)


def task_to_json(task: Task) -> tuple[str, str, str]:
    """(tools_json, reference_json, difficulty_json) as a TaskGenerated event carries them."""
    return json.dumps(task.tools), json.dumps(task.reference), json.dumps(task.difficulty, sort_keys=True)


def task_from_row(row: dict) -> Task:
    return Task(
        row["task_prompt"],
        json.loads(row["reference_json"]),
        json.loads(row["difficulty_json"] or "{}"),
        json.loads(row["tools_json"] or "[]"),
    )
