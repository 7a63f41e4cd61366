"""ALFWorld (Shridhar et al., 2021): household text games, played turn by turn through TextWorld.

Each game file (`game.tw-pddl`: a PDDL domain, grammar and problem) is started with `textworld.start` and
ALFWorld's own wrappers (object names demangled as in ALFWorld's TextWorld env). Every turn the agent sees
the task, its last few turns, the current observation and the admissible commands, and replies with one
command. A reply is taken as the admissible command it names, allowing for case, spacing and a near miss
(difflib similarity at least MATCH_CUTOFF, which a typo or a trailing period reaches and unrelated text does
not); any other reply costs the step and is answered "Nothing happens.", as ALFWorld's own environment
answers a command it cannot execute. The transcript records the reply beside the command taken. A game is won
when the env's `won` info turns true within 50 steps. The turn's prompt, the matching of a reply and the
answer to a command that does nothing are the world domain's (engine/domains/world.py), so that an agent trained
there is scored in the form it was trained in. Games are played in lockstep, a batch at a time, so
each turn is one batched generation. Success is reported overall and per task type (the game folder's
prefix: pick_and_place_simple, look_at_obj_in_light, pick_clean_then_place_in_recep, pick_heat_..., pick_cool_...,
pick_two_obj_and_place).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..domains.world import NOTHING, SYSTEM, closest, turn_prompt
from .base import Ask, Benchmark, DataMissing, Item, ItemResult, Progress, mean, per_category

MAX_STEPS = 50
BATCH_GAMES = 16  # games played at once (each holds a PDDL env in memory)


def textworld_modules():
    try:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    except ModuleNotFoundError as exc:
        raise DataMissing(
            f"alfworld: the {exc.name} package is not installed; `pip install alfworld` "
            "(pulls textworld[pddl]; `make install` does)"
        ) from None
    return textworld, AlfredDemangler, AlfredInfos


class Game:
    """One game being played: its env, what the agent has seen and done."""

    def __init__(self, item: Item, textworld, demangler, infos_wrapper):
        self.item = item
        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        self.env = textworld.start(item.data["path"], request_infos=infos, wrappers=[demangler(), infos_wrapper])
        state = self.env.reset()
        intro = state.feedback.strip()
        self.task = next((line for line in intro.splitlines() if line.startswith("Your task is to")), "")
        self.observation = intro.split("-=", 2)[-1].split("=-", 1)[-1].strip() if "-=" in intro else intro
        self.admissible = sorted(state["admissible_commands"] or [])
        self.turns: list[tuple[str, str]] = []  # (command, observation)
        self.transcript: list[str] = []
        self.won = bool(state["won"])
        self.done = self.won

    def ask(self) -> Ask:
        user = turn_prompt(self.task, self.turns, self.observation, self.admissible)
        return Ask(SYSTEM, user, max_new_tokens=16, item_id=self.item.item_id, turn=len(self.turns))

    def step(self, reply: str) -> None:
        command = closest(reply, self.admissible)
        if command is None:  # not a command the game knows: the step is spent, the game unchanged
            self.transcript.append(f"(none: reply {reply.strip()[:40]!r})")
            self.observation = NOTHING
            self.turns.append((reply.strip()[:80], NOTHING))
            self.done = len(self.turns) >= MAX_STEPS
            return
        state, _, done = self.env.step(command)
        self.transcript.append(command if command == reply.strip() else f"{command} (reply: {reply.strip()[:40]!r})")
        self.observation = state.feedback.strip()
        self.turns.append((command, self.observation))
        self.admissible = sorted(state["admissible_commands"] or [])
        self.won = bool(state["won"])
        self.done = self.won or done or len(self.turns) >= MAX_STEPS

    def close(self) -> None:
        self.env.close()


class ALFWorld(Benchmark):
    name = "alfworld"
    source = "alfworld/**/game.tw-pddl (ALFWorld json_2.1.1 valid_unseen games); see data/README.md"
    headline = "success"
    scoring = (
        "won within 50 steps; a reply that names no admissible command (difflib ratio < 0.8) costs the step: "
        '"Nothing happens."'
    )

    def load(self, data: Path | None, limit: int | None) -> list[Item]:
        root = self.file(data, "alfworld")
        # os.walk, not Path.glob: games may sit below a symlinked folder, which glob's ** does not enter.
        paths = sorted(
            Path(folder) / "game.tw-pddl"
            for folder, _, files in os.walk(root, followlinks=True)
            if "game.tw-pddl" in files
        )
        if not paths:
            raise DataMissing(f"{self.name}: no game.tw-pddl files under {root} ({self.source})")
        by_type: dict[str, list[Item]] = {}
        for path in paths:
            task_type = path.parent.parent.name.split("-")[0]
            game = self.read_json(path)
            walkthrough = game.get("walkthrough") if isinstance(game, dict) else None
            if not isinstance(walkthrough, list) or not all(isinstance(step, str) for step in walkthrough):
                raise DataMissing(
                    f"{self.name}: {path} is not a TextWorld game with a walkthrough (a list of commands)"
                )
            by_type.setdefault(task_type, []).append(
                Item(
                    f"alfworld-{path.parent.parent.name}-{path.parent.name}",
                    task_type,
                    {"path": str(path), "walkthrough": walkthrough},
                )
            )
        # Round-robin over task types, so --limit N samples every type.
        items, queues = [], [list(v) for _, v in sorted(by_type.items())]
        while any(queues):
            items += [q.pop(0) for q in queues if q]
        return items if limit is None else items[:limit]

    def gold(self, item: Item) -> str:
        return "\n".join(item.data["walkthrough"])

    def run(self, items: list[Item], agent, progress: Progress | None = None) -> list[ItemResult]:
        textworld, demangler, infos = textworld_modules()
        results: list[ItemResult] = []
        for start in range(0, len(items), BATCH_GAMES):
            games = [Game(item, textworld, demangler, infos) for item in items[start : start + BATCH_GAMES]]
            try:
                while not all(g.done for g in games):
                    playing = [g for g in games if not g.done]
                    replies = agent.respond([g.ask() for g in playing])
                    for game, reply in zip(playing, replies):
                        game.step(reply)
            finally:
                for g in games:
                    g.close()
            for g in games:
                results.append(
                    ItemResult(
                        g.item.item_id,
                        g.item.category,
                        " | ".join(g.transcript),
                        float(g.won),
                        {"steps": len(g.turns)},
                        f"{'won' if g.won else 'not won'} in {len(g.turns)} steps",
                    )
                )
            if progress:
                progress(len(results), len(items))
        return results

    def summary(self, results: list[ItemResult]) -> dict[str, float]:
        return {
            "success": mean([r.score for r in results]),
            **{f"success_{t}": v for t, v in per_category(results).items()},
            "items": len(results),
        }
