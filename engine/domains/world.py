"""world: a household text world in the style of ALFWorld, where an agent acts over turns (issue 29's domain).

A world is one room of numbered receptacles (cabinet 1, fridge 1, sinkbasin 1, ...) holding numbered objects,
and a goal in ALFWorld's words: "put some mug in cabinet", "clean some mug and put it in cabinet" (or heat it
with the microwave, or cool it with the fridge). The agent acts with ALFWorld's commands (go to, open, close,
take .. from, move .. to, clean/heat/cool .. with, inventory, look), sees ALFWorld's feedback, and is shown
the admissible commands every turn, as the ALFWorld benchmark shows them (engine/benchmarks/alfworld.py), so
that a model trained here speaks the benchmark's protocol.

The simulator writes a world as plain sentences, one fact each, in a fixed form (`parse_world`):

    task: clean some mug and put it in cabinet. mug 1 is in fridge 1. fridge 1 is closed.
    apple 1 is on countertop 1. cabinet 1 is closed.

Every receptacle a sentence names is in the room, and so is the appliance the goal needs. A world is valid when
it parses, names each object once, and its goal can be reached: `solve` finds a shortest solution by
breadth-first search over the world's states (a few thousand at most: one held object, the agent's place, the
open receptacles, where each object is and what was done to it), and its length is the world's difficulty.
The world is deterministic, so a trajectory is its commands: replaying them (`replay`) regenerates every
observation, and the checker scores a trajectory so. Written by hand: TextWorld plays ALFWorld's PDDL games but cannot
take a world a model wrote without a PDDL problem and a grammar file, which a 135M simulator cannot write.
"""

from __future__ import annotations

import difflib
import random
import re
from collections import deque
from dataclasses import dataclass, replace

from .base import Invalid, SimulatorRequest, Task, Verdict, example_summary

# The receptacles a world may have: (can be opened, what it does to an object used "with" it).
RECEPTACLES = {
    "cabinet": (True, ""),
    "drawer": (True, ""),
    "fridge": (True, "cool"),
    "microwave": (True, "heat"),
    "countertop": (False, ""),
    "diningtable": (False, ""),
    "shelf": (False, ""),
    "sinkbasin": (False, "clean"),
    "garbagecan": (False, ""),
}
APPLIANCE = {"clean": "sinkbasin 1", "heat": "microwave 1", "cool": "fridge 1"}  # what each treatment is done with
OBJECTS = ("mug", "apple", "bowl", "plate", "cup", "egg", "potato", "tomato", "knife", "spoon", "bread", "lettuce")
MAX_OBJECTS = 8
MAX_RECEPTACLES = 10

NAME = r"([a-z]+) (\d)"
PLACED = re.compile(rf"^{NAME} is (in|on) {NAME}$")
CLOSED = re.compile(rf"^{NAME} is closed$")
GOAL = re.compile(r"^task: (?:(clean|heat|cool) some ([a-z]+) and put it in ([a-z]+)|put some ([a-z]+) in ([a-z]+))$")
MIDDLE = "the middle of the room"

# The turn protocol, shared with the ALFWorld benchmark (engine/benchmarks/alfworld.py), so that an agent trained
# here is evaluated in the form it was trained in.
SYSTEM = (
    "You are playing a household text game. Each turn, reply with exactly one command from the list of "
    "admissible commands and nothing else."
)
HISTORY = 4  # turns of history a turn's prompt shows
MATCH_CUTOFF = 0.8  # difflib ratio from which a reply counts as the admissible command it resembles
NOTHING = "Nothing happens."  # ALFWorld's answer to a command it cannot execute


@dataclass(frozen=True)
class Goal:
    kind: str  # "put" or the treatment the object needs first: "clean", "heat", "cool"
    thing: str  # an object type: any numbered one of it will do
    target: str  # a receptacle type: any numbered one of it will do

    def text(self) -> str:
        if self.kind == "put":
            return f"put some {self.thing} in {self.target}"
        return f"{self.kind} some {self.thing} and put it in {self.target}"


@dataclass(frozen=True)
class Room:
    """A state of the world. Receptacles and objects are names ("cabinet 1", "mug 1"); `where` gives each object's
    receptacle, or "hand"; `done` the treatments each object has had."""

    receptacles: tuple[str, ...]
    goal: Goal
    at: str = MIDDLE
    opened: frozenset[str] = frozenset()
    where: tuple[tuple[str, str], ...] = ()
    done: tuple[tuple[str, frozenset[str]], ...] = ()

    # -- what the agent sees ---------------------------------------------------------------------------------
    def task(self) -> str:
        return f"Your task is to: {self.goal.text()}."

    def intro(self) -> str:
        seen = ", ".join(f"a {r}" for r in self.receptacles[:-1]) + f", and a {self.receptacles[-1]}"
        if len(self.receptacles) == 1:
            seen = f"a {self.receptacles[0]}"
        return f"You are in the middle of a room. Looking quickly around you, you see {seen}."

    def holding(self) -> str | None:
        return next((o for o, r in self.where if r == "hand"), None)

    def contents(self, receptacle: str) -> list[str]:
        return [o for o, r in self.where if r == receptacle]

    def describe(self, receptacle: str) -> str:
        """ALFWorld's feedback on arriving at or opening a receptacle."""
        if openable(receptacle) and receptacle not in self.opened:
            return f"The {receptacle} is closed."
        things = self.contents(receptacle)
        listed = ", ".join(f"a {o}" for o in things) if things else "nothing"
        if openable(receptacle):
            return f"The {receptacle} is open. In it, you see {listed}."
        return f"On the {receptacle}, you see {listed}."

    def admissible(self) -> list[str]:
        """The commands that do something here, sorted, as ALFWorld lists them."""
        commands = [f"go to {r}" for r in self.receptacles if r != self.at] + ["inventory", "look"]
        held = self.holding()
        if self.at != MIDDLE:
            here = self.at
            if openable(here):
                commands.append(f"close {here}" if here in self.opened else f"open {here}")
            if not openable(here) or here in self.opened:
                if held is None:
                    commands += [f"take {o} from {here}" for o in self.contents(here)]
                else:
                    commands.append(f"move {held} to {here}")
            treatment = RECEPTACLES[kind_of(here)][1]
            if held is not None and treatment:  # as in ALFWorld, an appliance works closed or open
                commands.append(f"{treatment} {held} with {here}")
        return sorted(commands)

    # -- acting ------------------------------------------------------------------------------------------------
    def step(self, command: str) -> tuple[Room, str]:
        """The world after `command` and what the agent is told; a command that is not admissible changes nothing
        and is answered as ALFWorld answers it."""
        if command not in self.admissible():
            return self, NOTHING
        if command == "look":
            place = "the middle of a room" if self.at == MIDDLE else f"the {self.at}"
            return self, f"You are facing {place}. Next to it, you see nothing."
        if command == "inventory":
            held = self.holding()
            return self, f"You are carrying: a {held}." if held else "You are not carrying anything."
        if command.startswith("go to "):
            there = command.removeprefix("go to ")
            moved = replace(self, at=there)
            return moved, f"You arrive at {there}. {moved.describe(there)}"
        if command.startswith("open "):
            opened = replace(self, opened=self.opened | {self.at})
            return opened, f"You open the {self.at}. {opened.describe(self.at)}"
        if command.startswith("close "):
            return replace(self, opened=self.opened - {self.at}), f"You close the {self.at}."
        if command.startswith("take "):
            thing = command.removeprefix("take ").split(" from ")[0]
            return self._put(thing, "hand"), f"You pick up the {thing} from the {self.at}."
        if command.startswith("move "):
            thing = command.removeprefix("move ").split(" to ")[0]
            return self._put(thing, self.at), f"You move the {thing} to the {self.at}."
        treatment, thing = command.split(" ")[0], " ".join(command.split(" ")[1:3])
        done = dict(self.done)
        done[thing] = done.get(thing, frozenset()) | {treatment}
        return replace(self, done=tuple(sorted(done.items()))), f"You {treatment} the {thing} using the {self.at}."

    def _put(self, thing: str, place: str) -> Room:
        return replace(self, where=tuple((o, place if o == thing else r) for o, r in self.where))

    def won(self) -> bool:
        done = dict(self.done)
        return any(
            kind_of(o) == self.goal.thing
            and r != "hand"
            and kind_of(r) == self.goal.target
            and (self.goal.kind == "put" or self.goal.kind in done.get(o, frozenset()))
            for o, r in self.where
        )


def kind_of(name: str) -> str:
    return name.rsplit(" ", 1)[0]


def openable(receptacle: str) -> bool:
    return RECEPTACLES[kind_of(receptacle)][0]


def parse_world(text: str) -> Room | Invalid:
    """The world a simulator's sentences describe, or why they do not describe one. Its goal must be reachable
    (`solve`), which is checked separately since it is the costly part."""
    sentences = [s.strip().lower() for s in re.split(r"[.\n]+", text) if s.strip()]
    goals = [m for m in map(GOAL.match, sentences) if m]
    if len(goals) != 1:
        return Invalid(f"no_goal: want one 'task: ...' sentence, found {len(goals)}")
    g = goals[0]
    goal = Goal(g[1], g[2], g[3]) if g[1] else Goal("put", g[4], g[5])
    if goal.thing not in OBJECTS or goal.target not in RECEPTACLES:
        return Invalid(f"unknown_name: the goal names {goal.thing!r} and {goal.target!r}")
    receptacles: set[str] = set()
    where: dict[str, str] = {}
    closed: set[str] = set()
    for sentence in sentences:
        if GOAL.match(sentence):
            continue
        placed, shut = PLACED.match(sentence), CLOSED.match(sentence)
        if placed:
            thing, receptacle = f"{placed[1]} {placed[2]}", f"{placed[4]} {placed[5]}"
            if placed[1] not in OBJECTS or placed[4] not in RECEPTACLES:
                return Invalid(f"unknown_name: {sentence!r}")
            if thing in where:
                return Invalid(f"placed_twice: {thing} is placed more than once")
            preposition = "in" if openable(receptacle) else "on"
            if placed[3] != preposition:
                return Invalid(f"wrong_preposition: {thing} is {preposition} a {placed[4]}, not {placed[3]} it")
            where[thing] = receptacle
            receptacles.add(receptacle)
        elif shut:
            receptacle = f"{shut[1]} {shut[2]}"
            if shut[1] not in RECEPTACLES or not RECEPTACLES[shut[1]][0]:
                return Invalid(f"not_openable: {sentence!r}")
            closed.add(receptacle)
            receptacles.add(receptacle)
        else:
            return Invalid(f"unreadable: {sentence[:80]!r}")
    if goal.kind != "put":
        receptacles.add(APPLIANCE[goal.kind])
    if not any(kind_of(r) == goal.target for r in receptacles):
        receptacles.add(f"{goal.target} 1")
    if not where:
        return Invalid("no_objects: the world places no object")
    if len(where) > MAX_OBJECTS or len(receptacles) > MAX_RECEPTACLES:
        return Invalid(f"too_large: {len(where)} objects, {len(receptacles)} receptacles")
    opened = frozenset(r for r in receptacles if openable(r) and r not in closed)
    return Room(tuple(sorted(receptacles)), goal, opened=opened, where=tuple(sorted(where.items())))


def solve(world: Room, limit: int = 50_000) -> list[str] | None:
    """A shortest list of commands that reaches the goal (breadth-first over states), or None when none does
    within `limit` states. "look" and "inventory" change nothing, so they are never part of one."""
    if world.won():
        return []
    parents: dict[Room, tuple[Room, str] | None] = {world: None}
    queue = deque([world])
    while queue and len(parents) < limit:
        state = queue.popleft()
        for command in state.admissible():
            if command in ("look", "inventory"):
                continue
            following, _ = state.step(command)
            if following in parents:
                continue
            parents[following] = (state, command)
            if following.won():
                path = []
                node = following
                while parents[node] is not None:
                    node, command = parents[node]
                    path.append(command)
                return path[::-1]
            queue.append(following)
    return None


def closest(reply: str, admissible: list[str]) -> str | None:
    """The admissible command a reply names (its first line, any case and spacing, or a near miss), else None."""
    text = " ".join(reply.strip().splitlines()[0].lower().split()) if reply.strip() else ""
    if text in admissible:
        return text
    match = difflib.get_close_matches(text, admissible, n=1, cutoff=MATCH_CUTOFF)
    return match[0] if match else None


def turn_prompt(task: str, turns: list[tuple[str, str]], observation: str, admissible: list[str]) -> str:
    """A turn's user message: the task, the last HISTORY turns (command, observation), what the agent sees now and
    the admissible commands, as ALFWorld's benchmark asks it."""
    history = "\n".join(f"> {c}\n{o}" for c, o in turns[-HISTORY:])
    return (
        f"{task}\n\n"
        + (f"Recent turns:\n{history}\n\n" if history else "")
        + f"Now: {observation}\n\nAdmissible commands: {', '.join(admissible)}\n\nCommand:"
    )


def world_text(world: Room) -> str:
    """The sentences that describe a world's start, in the form `parse_world` reads (and seeds are written in)."""
    placed = [f"{o} is {'in' if openable(r) else 'on'} {r}." for o, r in world.where]
    closed = [f"{r} is closed." for r in world.receptacles if openable(r) and r not in world.opened]
    return " ".join([f"task: {world.goal.text()}.", *placed, *closed])


MAX_TURNS = 12  # a trajectory's turns at most: the shortest solutions of the worlds seeds make are 4 to 9 commands
TARGETS = ("cabinet", "drawer", "countertop", "diningtable", "shelf")  # where a goal may ask an object put


class Episode:
    """One world being played by the agent: what it has seen and done, the prompt of its next turn."""

    def __init__(self, task: Task, max_turns: int = MAX_TURNS):
        world = parse_world(task.reference["world"])
        if isinstance(world, Invalid):
            raise ValueError(f"a world task whose world does not parse: {world.reason}")
        self.task, self.world, self.max_turns = task.prompt, world, max_turns
        self.observation = world.intro()
        self.turns: list[tuple[str, str]] = []  # (command taken, or the reply where none, observation)
        self.won = False

    @property
    def done(self) -> bool:
        return self.won or len(self.turns) >= self.max_turns

    def prompt(self) -> str:
        return turn_prompt(self.task, self.turns, self.observation, self.world.admissible())

    def step(self, reply: str) -> str:
        """Take the agent's reply as its command (the admissible one it names, else nothing happens); the command
        as the trajectory records it."""
        command = closest(reply, self.world.admissible())
        if command is None:
            recorded, self.observation = " ".join(reply.strip().splitlines()[:1])[:80], NOTHING
        else:
            recorded = command
            self.world, self.observation = self.world.step(command)
            self.won = self.world.won()
        self.turns.append((recorded, self.observation))
        return recorded


def replay(episode: Episode, replies: list[str]) -> Episode:
    """The episode after these replies, one a turn, until its goal or its last turn (later replies are not played,
    as ALFWorld ends a game at its goal)."""
    for reply in replies:
        if episode.done:
            break
        episode.step(reply)
    return episode


def offered_kinds(rng: random.Random) -> tuple[list[str], list[str]]:
    """The object and receptacle kinds a request offers: 4 and 5 at random, among them a goal's target."""
    objects, receptacles = sorted(rng.sample(OBJECTS, 4)), sorted(rng.sample(sorted(RECEPTACLES), 5))
    if not any(r in TARGETS for r in receptacles):
        receptacles = sorted({*receptacles[1:], rng.choice(TARGETS)})
    return objects, receptacles


def random_world(rng: random.Random, objects: list[str], receptacles: list[str]) -> Room:
    """A world of these object and receptacle kinds: a goal on one object, it and up to two others placed at
    random, each openable receptacle closed or not at random (how seeds and the validation set are made)."""
    kind = rng.choice(("put", "clean", "heat", "cool"))
    targets = [r for r in receptacles if r in TARGETS]
    goal = Goal(kind, rng.choice(objects), rng.choice(targets))
    places = [f"{r} 1" for r in receptacles]
    others = rng.sample([o for o in objects if o != goal.thing], min(2, len(objects) - 1))
    where = {f"{goal.thing} 1": rng.choice([p for p in places if kind_of(p) != goal.target])}
    where |= {f"{o} 1": rng.choice(places) for o in others[: rng.randint(0, len(others))]}
    text = " ".join(
        [f"task: {goal.text()}."]
        + [f"{o} is {'in' if openable(r) else 'on'} {r}." for o, r in sorted(where.items())]
        + [f"{r} 1 is closed." for r in receptacles if RECEPTACLES[r][0] and rng.random() < 0.5]
    )
    world = parse_world(text)
    assert isinstance(world, Room), (text, world)  # made from the grammar's own pieces
    return world


def world_grammar(objects: list[str], receptacles: list[str]) -> str:
    """The sentences a world is written in, with these names only: an EBNF grammar for xgrammar."""

    def either(names) -> str:
        return " | ".join(f'"{n}"' for n in names)

    openables = [r for r in receptacles if RECEPTACLES[r][0]]
    rules = [
        'root ::= goal (" " placed)+ (" " shut)*',
        'goal ::= "task: " (treat " some " thing " and put it in " target | "put some " thing " in " target) "."',
        'treat ::= "clean" | "heat" | "cool"',
        f"thing ::= {either(objects)}",
        f"target ::= {either(r for r in receptacles if r in TARGETS)}",
    ]
    surfaces = [r for r in receptacles if not RECEPTACLES[r][0]]
    placed = [f'" 1 is in " ({either(openables)})'] if openables else []
    placed += [f'" 1 is on " ({either(surfaces)})'] if surfaces else []
    rules.append(f'placed ::= ({either(objects)}) ({" | ".join(placed)}) " 1."')
    rules.append(f'shut ::= ({either(openables)}) " 1 is closed."' if openables else 'shut ::= ""')
    return "\n".join(rules)


class World:
    """The world domain: the simulator writes a world (`parse_world`'s sentences) from the object and receptacle
    kinds its request offers; a world is a task when it parses, uses only those names and its goal can be reached
    in at least one command; its level is its shortest solution's length. The agent plays it over turns
    (`Episode`), and a trajectory's completion is its commands, one a line, which `check` replays."""

    name = "world"
    agent_system = SYSTEM
    difficulty_feature = "level"
    max_turns = MAX_TURNS

    def simulator_request(self, rng: random.Random, performance: str) -> SimulatorRequest:
        objects, receptacles = offered_kinds(rng)
        prompt = (
            "Write a household world for the assistant: its task, where each object is, which receptacles are "
            "closed, one sentence each, like: task: put some mug in shelf. mug 1 is in cabinet 1. cabinet 1 is "
            f"closed. Objects: {', '.join(objects)}. Receptacles: {', '.join(receptacles)}. "
            f"Assistant's results: {performance}."
        )
        context = {"objects": objects, "receptacles": receptacles}
        return SimulatorRequest(prompt, context, grammar=world_grammar(objects, receptacles))

    def parse(self, generation: str, context: dict) -> Task | Invalid:
        world = parse_world(generation)
        if isinstance(world, Invalid):
            return world
        offered = set(context.get("objects", OBJECTS)) | set(context.get("receptacles", RECEPTACLES))
        offered |= {kind_of(r) for r in APPLIANCE.values()} if world.goal.kind != "put" else set()
        unknown = sorted(({kind_of(n) for n, _ in world.where} | {kind_of(r) for r in world.receptacles}) - offered)
        if unknown:
            return Invalid(f"not_offered: {', '.join(unknown)} not among the request's names")
        solution = solve(world)
        if solution is None:
            return Invalid(f"unsolvable: no {world.goal.thing} can be made to {world.goal.text()}")
        if not solution:
            return Invalid("already_done: the goal holds before any command")
        difficulty = {
            "level": len(solution),
            "objects": len(world.where),
            "receptacles": len(world.receptacles),
            "closed": sum(openable(r) and r not in world.opened for r in world.receptacles),
        }
        return Task(world.task(), {"world": world_text(world), "solution": solution}, difficulty)

    def seeds(self, rng: random.Random, n: int) -> list[tuple[SimulatorRequest, str, Task]]:
        out = []
        while len(out) < n:
            request = self.simulator_request(rng, example_summary(rng, self.difficulty_feature, list(range(3, 10))))
            text = world_text(random_world(rng, request.context["objects"], request.context["receptacles"]))
            task = self.parse(text, request.context)
            if isinstance(task, Task):  # a random world may already hold its goal, or lack its object
                out.append((request, text, task))
        return out

    def reference_answer(self, task: Task) -> str:
        return "\n".join(task.reference["solution"])

    def agent_prompt(self, task: Task) -> str:
        """The first turn's prompt (a turn's prompt is `Episode.prompt`)."""
        return Episode(task).prompt()

    def episode(self, task: Task) -> Episode:
        return Episode(task, self.max_turns)

    def check(self, task: Task, answer: str) -> Verdict:
        """Replay the trajectory's commands (one a line) from the world's start: success is the goal reached within
        max_turns. A one-turn answer is a trajectory of one command."""
        episode = replay(self.episode(task), answer.splitlines() or [""])
        detail = f"{'won' if episode.won else 'not won'} in {len(episode.turns)} turns"
        return Verdict(float(episode.won), episode.won, f"{detail} (shortest {len(task.reference['solution'])})")

    def validation_set(self, n: int) -> list[Task]:
        """n held-out worlds from their own random stream."""
        rng = random.Random(0x7003)
        tasks: list[Task] = []
        while len(tasks) < n:
            task = self.parse(world_text(random_world(rng, *offered_kinds(rng))), {})
            if isinstance(task, Task):
                tasks.append(task)
        return tasks
