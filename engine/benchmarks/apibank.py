"""API-Bank API calls (Li et al., 2023): given the dialogue and the API descriptions, write the call.

Levels: level-1-api.json (call an API whose description is given) and, where the data folder holds it,
level-2-api.json (the same row format; the API must first be found). Each item's category is its level, and
the summary gives the accuracy per level beside the overall one, as API-Bank reports them separately.

The agent answers `API-Request: [ApiName(key='value', ...)]`. Scoring: name and argument match. API-Bank's
official metric executes the predicted and the gold call in its API simulator and compares the results; that
simulator is the Python implementation of each API (apis/*.py in DAMO-ConvAI), which is not part of the data
here (only init_database/*.json, the simulator's initial state, is), so the calls are compared instead: the
same API name and the same arguments, string values compared after trimming and lowercasing (API-Bank's
APIs ignore case in ids and names). A call the simulator would answer identically with differently written
arguments (e.g. '2023-03-26' vs 'March 26th') counts as wrong here. Arguments are read as literals, never run.
Items whose own gold call does not read as a literal call are left out and counted.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..domains.calls import read_calls
from .base import Ask, Benchmark, DataMissing, Item, ItemResult, limited, mean, per_category

SYSTEM = "You call APIs for a user. Reply with the API request only."
REQUEST = re.compile(r"\[\s*[A-Za-z_][\w.]*\(.*?\)\s*\]", re.DOTALL)  # the first bracketed call
LEVELS = (1, 2)
SCORING = "name and argument match (API-Bank's API simulator is not in the data; see engine/benchmarks/apibank.py)"


def read_call(text: str) -> list[tuple[str, dict]] | str:
    """The calls of the first `[Name(...)]` in the text, with or without API-Bank's "API-Request:" before it."""
    match = REQUEST.search(text)
    return read_calls(match.group(0) if match else text.strip())


def same_value(a, b) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    if (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return float(a) == float(b)
    return a == b


class APIBank(Benchmark):
    name = "api-bank"
    source = (
        "api-bank/level-1-api.json (and level-2-api.json) from AlibabaResearch/DAMO-ConvAI api-bank/test-data; "
        "see data/README.md"
    )
    headline = "accuracy"
    scoring = SCORING

    def load(self, data: Path | None, limit: int | None) -> list[Item]:
        """Level 1 (required) and level 2 (when present); `limit` applies per level, so both are sampled."""
        path = self.file(data, "api-bank/level-1-api.json")
        items, self.skipped = [], 0
        for level in LEVELS:
            level_path = path.with_name(f"level-{level}-api.json")
            if level > 1 and not level_path.is_file():
                continue
            items += limited(self.level_items(level, level_path), limit)
        if not items:
            raise DataMissing(f"{self.name}: {path.parent} holds no items with a readable expected_output")
        return items

    def level_items(self, level: int, path: Path) -> list[Item]:
        """The level's items; a record whose expected_output holds no readable call is skipped (and counted), one
        whose fields are not text stops the load, naming it."""
        items = []
        for index, row in enumerate(self.records(path)):  # an item's id is its level and place in the file
            instruction, request = self.text(path, index, row, "instruction"), self.text(path, index, row, "input")
            gold = read_call(self.text(path, index, row, "expected_output"))
            if isinstance(gold, str) or not gold:
                self.skipped += 1
                continue
            api = str(row.get("file") or "").split("-level-")[0].split("-")[0]
            item_id = f"api-bank-{index}" if level == 1 else f"api-bank-l{level}-{index}"
            items.append(
                Item(
                    item_id,
                    f"level-{level}",
                    {
                        "instruction": instruction,
                        "input": request,
                        "expected_output": row["expected_output"],
                        "gold": gold,
                        "api": api,
                    },
                )
            )
        return items

    def ask(self, item: Item) -> Ask:
        return Ask(SYSTEM, f"{item.data['instruction'].strip()}\n\n{item.data['input'].strip()}", max_new_tokens=96)

    def gold(self, item: Item) -> str:
        return item.data["expected_output"]

    def score(self, item: Item, response: str) -> ItemResult:
        predicted = read_call(response)
        if isinstance(predicted, str):
            return ItemResult(
                item.item_id, item.category, response, 0.0, detail=f"no readable API request: {predicted}"
            )
        ((gold_name, gold_args),) = item.data["gold"][:1]
        if len(predicted) != 1:
            return ItemResult(
                item.item_id, item.category, response, 0.0, detail=f"{len(predicted)} calls, expected one"
            )
        name, args = predicted[0]
        if name != gold_name:
            return ItemResult(item.item_id, item.category, response, 0.0, detail=f"called {name}, expected {gold_name}")
        if set(args) != set(gold_args):
            return ItemResult(
                item.item_id,
                item.category,
                response,
                0.0,
                detail=f"arguments {sorted(args)}, expected {sorted(gold_args)}",
            )
        wrong = [k for k in gold_args if not same_value(args[k], gold_args[k])]
        if wrong:
            return ItemResult(
                item.item_id,
                item.category,
                response,
                0.0,
                detail=f"{wrong[0]}={args[wrong[0]]!r}, expected {gold_args[wrong[0]]!r}",
            )
        return ItemResult(item.item_id, item.category, response, 1.0, detail="same call")

    def summary(self, results: list[ItemResult]) -> dict[str, float]:
        by_level = {f"accuracy_{level.replace('-', '_')}": value for level, value in per_category(results).items()}
        return {
            "accuracy": mean([r.score for r in results]),
            **by_level,
            "items": len(results),
            "items_left_out": getattr(self, "skipped", 0),
        }
