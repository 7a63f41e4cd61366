"""Bamboogle (Press et al., 2022): 125 two-hop questions Google answers wrong; exact match and token F1.

Scoring is SQuAD's: both answers normalised (lowercase, no punctuation, no articles, single spaces), exact
match, and the F1 of their token bags. The agent's first non-empty line is its answer. The headline is
exact match (what GenEnv's table reports as accuracy).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..domains.qa import normalise as normalize_answer  # SQuAD's normaliser, one for training and evaluation
from .base import Ask, Benchmark, DataMissing, Item, ItemResult, limited, mean

SYSTEM = "Answer the question with the answer only: a few words, no explanation."


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def first_line(text: str) -> str:
    return next((line.strip() for line in text.strip().splitlines() if line.strip()), "")


class Bamboogle(Benchmark):
    name = "bamboogle"
    source = "bamboogle/bamboogle.json from LoganMilandin/comp-gap-public data/bamboogle.json; see data/README.md"
    headline = "exact_match"
    scoring = "exact match and token F1 after SQuAD normalisation"

    def load(self, data: Path | None, limit: int | None) -> list[Item]:
        path = self.file(data, "bamboogle/bamboogle.json")
        items = [
            Item(
                f"bamboogle-{i}",
                "two-hop",
                {"question": self.text(path, i, r, "Question"), "answer": self.text(path, i, r, "Answer")},
            )
            for i, r in enumerate(self.records(path))
        ]
        if not items:
            raise DataMissing(f"{self.name}: {path} holds no items with Question and Answer")
        return limited(items, limit)

    def ask(self, item: Item) -> Ask:
        return Ask(SYSTEM, f"Question: {item.data['question']}\nAnswer:", max_new_tokens=24)

    def gold(self, item: Item) -> str:
        return item.data["answer"]

    def score(self, item: Item, response: str) -> ItemResult:
        answer = first_line(response)
        em = float(normalize_answer(answer) == normalize_answer(item.data["answer"]))
        f1 = token_f1(answer, item.data["answer"])
        return ItemResult(
            item.item_id,
            item.category,
            response,
            em,
            {"exact_match": em, "f1": round(f1, 4)},
            f"answered {answer!r}, gold {item.data['answer']!r}",
        )

    def summary(self, results: list[ItemResult]) -> dict[str, float]:
        return {
            "exact_match": mean([r.metrics["exact_match"] for r in results]),
            "f1": mean([r.metrics["f1"] for r in results]),
            "items": len(results),
        }
