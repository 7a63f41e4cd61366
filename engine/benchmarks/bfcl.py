"""BFCL (Berkeley Function-Calling Leaderboard), its non-live AST categories, scored by bfcl-eval's own checker.

    simple_python, multiple, parallel, parallel_multiple   the answer's calls must match a possible answer
                                                           (bfcl_eval.eval_checker.ast_eval.ast_checker)
    irrelevance                                            right when the answer holds no function call

Data: bfcl_eval/data/BFCL_v4_<category>.json and possible_answer/ from the PyPI package bfcl-eval (JSON lines).
The agent answers in BFCL's prompting format, `[func_name(param=value, ...)]`.

Answers are read and matched by engine/domains/calls.py, the matcher the toolcall domain's reward uses too:
bfcl-eval's `ast_checker` behind both, with arguments read as Python literals and never evaluated (bfcl-eval's
own decoder evaluates arithmetic with `eval`; such answers count as wrong here). By default an answer is read as
bfcl-eval's default prompting decoder reads it: a ```python fence makes it unreadable, positional arguments are
dropped. `genenv eval --bfcl-reading lenient` reads fences and one call per line too; the results table's
scoring names the reading.

Summary as BFCL computes it (bfcl_eval/eval_checker/eval_runner_helper.py): the non-live AST accuracy is the
unweighted mean of simple, multiple, parallel and parallel_multiple, where simple is the unweighted mean of
simple_python, simple_java and simple_javascript; only simple_python is run here, so simple = simple_python.
Irrelevance is BFCL's separate hallucination measure and is not part of that mean.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..domains.calls import READINGS, match_calls, read_calls
from .base import Ask, Benchmark, DataMissing, Item, ItemResult, limited, mean, per_category

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
AST_CATEGORIES = CATEGORIES[:4]
FINAL_CATEGORIES = ("simple_python", "multiple")  # a run's end-of-run subset (RunConfig.final_bfcl_items)
SYSTEM = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, make one or more function calls to achieve the purpose. If none of the functions "
    "can be used, point it out and make no call. Reply with the calls only, in the format "
    "[func_name1(param1=value1, param2=value2), func_name2(param=value)] and nothing else."
)
NO_CALL = "None of the given functions can be used for this question."


def decode(response: str, reading: str = "bfcl") -> list[dict] | str:
    """The answer's calls as BFCL's checker takes them ([{name: {param: value}}]), or why they cannot be read."""
    calls = read_calls(response, reading)
    return calls if isinstance(calls, str) else [{name: args} for name, args in calls]


def first(options: list):
    """The first possible value that is not "" (which means "may be left out"), or None when there is none."""
    return next((o for o in options if o != ""), None)


def chosen(option):
    """One value out of a possible answer: dict parameters hold {key: [options]}, lists of them hold such dicts."""
    if isinstance(option, dict):
        return {k: chosen(first(v)) for k, v in option.items() if isinstance(v, list) and first(v) is not None}
    if isinstance(option, list) and option and all(isinstance(x, dict) for x in option):
        return [chosen(x) for x in option]
    return option


def gold_call_text(ground_truth: list[dict], functions: list[dict]) -> str:
    """A call list the checker accepts: each parameter's first possible value. A parameter that may be left out
    ("" among its possibilities) is left out when the function does not require it and either lists "" first
    or does not declare it (a few possible answers name parameters their function lacks)."""
    spec = {f["name"]: f.get("parameters", {}) for f in functions}
    calls = []
    for call in ground_truth:
        ((name, params),) = call.items()
        required, declared = set(spec.get(name, {}).get("required", [])), set(spec.get(name, {}).get("properties", {}))
        args = {
            k: chosen(first(v))
            for k, v in params.items()
            if first(v) is not None and (k in required or "" not in v or (v[0] != "" and k in declared))
        }
        calls.append(f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")")
    return "[" + ", ".join(calls) + "]"


class BFCL(Benchmark):
    name = "bfcl"
    source = "the PyPI package bfcl-eval ships bfcl_eval/data; `pip install --no-deps bfcl-eval`"
    headline = "non_live_ast"

    def __init__(self, categories: tuple[str, ...] = CATEGORIES, reading: str = "bfcl"):
        if reading not in READINGS:
            raise ValueError(f"the BFCL reading must be one of {', '.join(READINGS)}, got {reading!r}")
        self.categories, self.reading = categories, reading
        self.scoring = (
            f"bfcl-eval's ast_checker after {READINGS[reading]}; arguments read as literals, never "
            "evaluated (see engine/domains/calls.py)"
        )

    def data_root(self, data: Path | None) -> Path:
        """--data may point at a folder holding BFCL_v4_*.json and possible_answer/; default: bfcl-eval's own."""
        if data is not None and (Path(data) / "possible_answer").is_dir():
            return Path(data)
        try:
            import bfcl_eval
        except ModuleNotFoundError:
            raise DataMissing(f"bfcl: no BFCL data: {self.source}") from None
        return Path(bfcl_eval.__file__).parent / "data"

    def load(self, data: Path | None, limit: int | None) -> list[Item]:
        root = self.data_root(data)
        items = []
        for category in self.categories:
            questions_path = root / f"BFCL_v4_{category}.json"
            questions = self.records(questions_path, lines=True)
            answers_path = root / "possible_answer" / f"BFCL_v4_{category}.json"
            answers = (
                {}
                if category == "irrelevance"
                else {
                    self.text(answers_path, i, a, "id"): self.field(answers_path, i, a, "ground_truth", list)
                    for i, a in enumerate(self.records(answers_path, lines=True))
                }
            )
            for i, q in enumerate(questions):
                self.text(questions_path, i, q, "id")
                self.field(questions_path, i, q, "question", list)
                self.field(questions_path, i, q, "function", list)
            chosen = limited(
                [
                    Item(
                        q["id"],
                        category,
                        {"question": q["question"], "functions": q["function"], "ground_truth": answers.get(q["id"])},
                    )
                    for q in questions
                ],
                limit,
            )
            items += chosen  # --limit applies per category, so every category is sampled
        return items

    def ask(self, item: Item) -> Ask:
        turns = [m["content"] for turn in item.data["question"] for m in turn if m.get("role") == "user"]
        functions = json.dumps(item.data["functions"], indent=None)
        return Ask(SYSTEM, f"Functions: {functions}\n\nQuestion: {' '.join(turns)}", max_new_tokens=160)

    def gold(self, item: Item) -> str:
        return (
            NO_CALL
            if item.category == "irrelevance"
            else gold_call_text(item.data["ground_truth"], item.data["functions"])
        )

    def score(self, item: Item, response: str) -> ItemResult:
        decoded = decode(response, self.reading)
        if item.category == "irrelevance":
            called = not isinstance(decoded, str) and bool(decoded)
            return ItemResult(
                item.item_id,
                item.category,
                response,
                float(not called),
                detail="made a call where none applies" if called else "no call",
            )
        match = match_calls(item.data["functions"], response, item.data["ground_truth"], item.category, self.reading)
        return ItemResult(item.item_id, item.category, response, float(match.valid), detail=match.detail)

    def summary(self, results: list[ItemResult]) -> dict[str, float]:
        by_category = per_category(results)
        ast = [by_category[c] for c in AST_CATEGORIES if c in by_category]
        out = {f"accuracy_{c}": v for c, v in by_category.items()}
        out["non_live_ast"] = mean(ast)
        out["items"] = len(results)
        return out
