"""One matcher for tool calls: the toolcall domain's checker (the agent's reward) and the BFCL benchmark read
leniently give the same verdict on every BFCL non-live item's gold answer and on 8 perturbations of each
(engine/domains/calls.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.benchmarks.bfcl import AST_CATEGORIES, BFCL
from engine.domains import Task, get_domain
from engine.domains.calls import possible_answers, read_calls
from engine.domains.toolcall import TOOLS

pytestmark = pytest.mark.unit


def call_text(calls: list[tuple[str, dict]]) -> str:
    return (
        "["
        + ", ".join(f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")" for name, args in calls)
        + "]"
    )


def altered(value):
    """A different value of the same type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + " zz"
    if isinstance(value, list):
        return value[:-1] if value else ["zz"]
    if isinstance(value, dict):
        return {**value, "zz": 1}
    return "zz"


def retyped(value):
    """The value as another type: a number as its text, anything else as a number."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 7


def with_first_argument(calls, change):
    (name, args), *rest = calls
    if not args:
        return [(name, {"zz": 1}), *rest]
    key = next(iter(args))
    return [(name, change(dict(args), key)), *rest]


def perturbations(gold: str) -> dict[str, str]:
    """8 answers derived from the gold one, some right by BFCL's rules (reordered calls, case, a fence), most not."""
    calls = read_calls(gold)
    assert not isinstance(calls, str), gold
    (first_name, first_args), *rest = calls
    uppercase = [(n, {k: v.upper() if isinstance(v, str) else v for k, v in a.items()}) for n, a in calls]
    return {
        "drop_argument": call_text(with_first_argument(calls, lambda a, k: {x: v for x, v in a.items() if x != k})),
        "extra_argument": call_text([(first_name, {**first_args, "genenv_extra": 1}), *rest]),
        "renamed_function": call_text([(first_name + "_v2", first_args), *rest]),
        "altered_value": call_text(with_first_argument(calls, lambda a, k: {**a, k: altered(a[k])})),
        "retyped_value": call_text(with_first_argument(calls, lambda a, k: {**a, k: retyped(a[k])})),
        "call_count": call_text(calls[:-1] if rest else calls + calls),
        "reordered_or_uppercase": call_text(calls[::-1] if rest else uppercase),
        "fenced_lines": "```python\n" + "\n".join(call_text([c])[1:-1] for c in calls) + "\n```",
    }


@pytest.fixture(scope="module")
def bfcl_items():
    benchmark = BFCL(categories=AST_CATEGORIES, reading="lenient")  # the reading the reward uses
    return benchmark, benchmark.load(None, None)


def test_toolcall_and_bfcl_give_equal_verdicts_on_every_non_live_item_and_8_perturbations(bfcl_items):
    benchmark, items = bfcl_items
    toolcall = get_domain("toolcall")
    assert Counter(i.category for i in items) == {
        "simple_python": 400,
        "multiple": 200,
        "parallel": 200,
        "parallel_multiple": 200,
    }
    outcomes: Counter = Counter()
    for item in items:
        task = Task(prompt="", reference=item.data["ground_truth"], tools=item.data["functions"])
        gold = benchmark.gold(item)
        answers = {"gold": gold, **perturbations(gold)}
        for kind, answer in answers.items():
            evaluation = benchmark.score(item, answer).score == 1.0
            reward = toolcall.check(task, answer)
            assert reward.success == evaluation, (item.item_id, kind, answer, reward.detail)
            outcomes[kind, evaluation] += 1
    n = len(items)
    assert outcomes["gold", True] == n  # every gold answer is right for both
    # The perturbations are not all alike: each kind that breaks a rule is wrong for (nearly) every item, and the
    # ones BFCL's rules allow are right for most, so equal verdicts are not equal by accident.
    for kind in ("extra_argument", "renamed_function", "altered_value", "retyped_value", "call_count"):
        assert outcomes[kind, False] >= 0.9 * n, (kind, outcomes)
    assert outcomes["fenced_lines", True] == n
    assert outcomes["reordered_or_uppercase", True] >= 0.9 * n
    assert outcomes["drop_argument", False] >= 0.5 * n


def test_a_toolcall_reference_means_the_same_to_the_matcher_as_its_bfcl_form():
    """The domain's own tasks go through the same matcher: a reference value is the one possible value, an
    optional parameter at its default may be left out, and one the reference leaves out only at its default."""
    weather = TOOLS["get_weather"]
    assert possible_answers(
        [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "fahrenheit"}}], [weather]
    ) == [{"get_weather": {"city": ["Oslo"], "unit": ["fahrenheit"]}}]
    assert possible_answers([{"name": "get_weather", "arguments": {"city": "Oslo"}}], [weather]) == [
        {"get_weather": {"city": ["Oslo"], "unit": ["celsius", ""]}}
    ]
    assert possible_answers([{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}], [weather]) == [
        {"get_weather": {"city": ["Oslo"], "unit": ["celsius", ""]}}
    ]
    toolcall = get_domain("toolcall")
    task = Task("", [{"name": "get_weather", "arguments": {"city": "Oslo"}}], tools=[weather])
    assert toolcall.check(task, "get_weather(city='OSLO')").success
    assert not toolcall.check(task, "get_weather(city='Oslo', unit='fahrenheit')").success


@pytest.mark.unit
@pytest.mark.parametrize("answer", ["f(a=1jand 2)", "[f(x=1jor 2)]", "f(a=0x1for x in y)"])
def test_odd_literals_in_an_answer_are_read_without_python_warnings(answer):
    """CPython warns about literals such as "1jand" while parsing; an answer is data, so reading it warns nothing."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_calls(answer)
        read_calls(answer, reading="bfcl")
    assert not caught, [str(w.message) for w in caught]
