"""Tool calls: reading them from an answer, and matching them against possible answers by BFCL's rules.

One matcher for training and evaluation: the toolcall domain's checker (the agent's reward) and the BFCL
benchmark both call `match_calls`, which runs bfcl-eval's own AST checker
(`bfcl_eval.eval_checker.ast_eval.ast_checker`), so a reward and an evaluation that read an answer the same way
cannot disagree on it. tests/test_calls.py holds them to that, with the lenient reading, on every BFCL non-live
item's gold answer and 8 perturbations of each; tests/test_eval.py holds the default reading to bfcl-eval's own
decoder and checker.

    read_calls(answer, reading)            [(dotted name, {param: literal})], or why the answer is not calls
    possible_answers(reference, tools)     a toolcall reference in BFCL's ground-truth form
    match_calls(tools, answer, possible)   Match(valid, detail)

Two readings of an answer (READINGS). "bfcl" is what bfcl-eval's default prompting decoder
(`default_decode_ast_prompting`) accepts: the BFCL benchmark scores with it by default, so its figures are
comparable with the leaderboard's. "lenient" also takes a ```python fence and one call per line. The toolcall
domain's reward reads leniently.

What is written here and not taken from bfcl-eval, and why:
- Reading the answer. bfcl-eval's decoder evaluates arithmetic in arguments with `eval` and reads a bare
  name as its string; generated text is data and is never evaluated here, so argument values must be Python
  literals (`ast.literal_eval`) and anything else is an answer that is not a call.
- Importing the checker. `ast_checker.py` imports `bfcl_eval.constants.model_config` for one lookup (whether
  a provider needs dots in function names turned into underscores), and that module imports every provider's
  handler and SDK. It is imported with a small stand-in for that one module, naming the only field the checker
  reads (`underscore_to_dot`, false: our agent writes names as BFCL does).
- BFCL's rules in brief: the function name, every required parameter present, no parameter the possible
  answer does not list, each value of the schema's type (an int is accepted for a float), strings compared
  after lower-casing and removing spaces and `,./-_*^`, a parameter whose possibilities include "" may be left
  out. Parallel calls match in any order.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import sys
import types
import warnings
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace

MODEL_NAME = "genenv"  # what the checker is told the answers' model is (it only matters for underscore_to_dot)


class CheckerMissing(RuntimeError):
    """bfcl-eval is not installed: nothing can score tool calls."""


@functools.cache
def bfcl_checker():
    """bfcl-eval's `ast_checker` and its Language enum, imported without the provider SDKs (see the docstring)."""
    name = "bfcl_eval.constants.model_config"
    inserted = name not in sys.modules
    if inserted:
        stand_in = types.ModuleType(name)
        stand_in.MODEL_CONFIG_MAPPING = defaultdict(lambda: SimpleNamespace(underscore_to_dot=False))
        sys.modules[name] = stand_in
    try:
        checker = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
        enums = importlib.import_module("bfcl_eval.constants.enums")
    except ModuleNotFoundError as exc:
        raise CheckerMissing(
            f"tool calls are scored by bfcl-eval's checker, and the package is not installed "
            f"({exc.name}); `pip install --no-deps bfcl-eval` (make install does)"
        ) from None
    finally:
        if inserted:
            sys.modules.pop(name, None)  # later imports of the real module are not answered by the stand-in
    return checker.ast_checker, enums.Language.PYTHON


READINGS = {
    "bfcl": "bfcl-eval's default prompting decoder: backticks, newlines and spaces stripped from both ends, "
    "[ ] added where missing, one Python list of calls; positional arguments dropped",
    "lenient": "lenient reading, not bfcl-eval's: also a ```python or ```json fence and one call per line; "
    "positional arguments refused",
}


def parse_expression(text: str) -> ast.expr:
    """An expression's syntax tree (never evaluated), without the SyntaxWarnings CPython prints for odd literals
    ("1j"-like tokens in a model's text): a model's answer is data, and its oddities are not the run's warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(text, mode="eval").body


def read_calls(answer: str, reading: str = "lenient") -> list[tuple[str, dict]] | str:
    """The calls in an answer as (dotted name, literal arguments), or the reason they cannot be read, by one of
    READINGS. Lenient accepts `[f(a=1), g(b='x')]`, one call per line, and either inside a ``` fence."""
    if reading == "bfcl":
        return read_calls_as_bfcl(answer)
    if reading != "lenient":
        raise ValueError(f"reading must be one of {', '.join(READINGS)}, got {reading!r}")
    text = answer.strip().strip("`").strip()
    text = re.sub(r"^(python|json)\s*\n", "", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    try:
        tree = parse_expression(text)
        nodes = list(tree.elts) if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        try:
            nodes = [parse_expression(line) for line in lines]
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return "not a call: the answer does not parse as Python call syntax"
    return _literal_calls(nodes, drop_positional=False)


def read_calls_as_bfcl(answer: str) -> list[tuple[str, dict]] | str:
    """The calls as bfcl-eval's `default_decode_ast_prompting` reads them (READINGS["bfcl"]), with argument values
    read as literals rather than evaluated."""
    text = answer.strip("`\n ")
    text = text if text.startswith("[") else "[" + text
    text = text if text.endswith("]") else text + "]"
    try:
        tree = parse_expression(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return "not a call: the answer does not parse as a Python list of calls"
    return _literal_calls(list(tree.elts) if isinstance(tree, (ast.List, ast.Tuple)) else [tree], drop_positional=True)


def _literal_calls(nodes: list[ast.expr], drop_positional: bool) -> list[tuple[str, dict]] | str:
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call):
            return "not a call"
        name = _dotted(node.func)
        if name is None:
            return "not a plain function name"
        if node.args and not drop_positional:
            return f"{name}: positional arguments are not allowed"
        args = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                return f"{name}: **kwargs are not allowed"
            try:
                args[keyword.arg] = ast.literal_eval(keyword.value)  # literals only: nothing is executed
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return f"{name}({keyword.arg}=...): not a literal value"
        calls.append((name, args))
    return calls


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def is_possible_answer(call: dict) -> bool:
    """BFCL's form {name: {param: [values]}} rather than toolcall's {"name": ..., "arguments": {...}}."""
    return len(call) == 1 and "name" not in call and isinstance(next(iter(call.values())), dict)


def possible_answers(reference: list[dict], tools: list[dict]) -> list[dict]:
    """A toolcall reference ([{"name", "arguments"}]) as BFCL's ground truth ([{name: {param: [values]}}]): a value
    the reference gives is the one possible value (and "" too, leaving it out, when it is an optional parameter's
    default); an optional parameter the reference leaves out is possible only at its default, or left out.
    Calls already in BFCL's form pass through."""
    schemas = {t.get("name"): t.get("parameters", {}) for t in tools}
    out = []
    for call in reference:
        if is_possible_answer(call):
            out.append(call)
            continue
        params = schemas.get(call["name"], {})
        properties, required = params.get("properties", {}), params.get("required", [])
        possible = {}
        for name, value in call["arguments"].items():
            optional_default = name not in required and "default" in properties.get(name, {})
            possible[name] = [value, ""] if optional_default and properties[name]["default"] == value else [value]
        for name, spec in properties.items():
            if name not in possible and name not in required and "default" in spec:
                possible[name] = [spec["default"], ""]
        out.append({call["name"]: possible})
    return out


@dataclass
class Match:
    valid: bool
    detail: str


def match_calls(
    tools: list[dict],
    answer: str | list[tuple[str, dict]],
    possible: list[dict],
    category: str | None = None,
    reading: str = "lenient",
) -> Match:
    """Whether `answer` (text, or calls read_calls already read) makes the calls `possible` describes, with the
    functions `tools` offered, by bfcl-eval's checker. category: a BFCL test category, which picks the checker
    (simple, multiple, parallel); by default "parallel" for several expected calls and "multiple" for one (it
    finds the expected function among those offered, as simple does when only one is offered). reading: how a
    text answer is read (READINGS)."""
    calls = read_calls(answer, reading) if isinstance(answer, str) else answer
    if isinstance(calls, str):
        return Match(False, f"ast_decoder:decoder_failed: {calls}")
    checker, python = bfcl_checker()
    category = category or ("parallel" if len(possible) > 1 else "multiple")
    try:
        verdict = checker(tools, [{name: args} for name, args in calls], possible, python, category, MODEL_NAME)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        # A task whose schema the checker cannot read (a type it does not know, a function it does not offer).
        return Match(False, f"checker_error: {exc.__class__.__name__}: {exc}"[:500])
    if verdict["valid"]:
        return Match(True, "valid")
    return Match(False, f"{verdict.get('error_type')}: {'; '.join(map(str, verdict.get('error', [])))}"[:500])
