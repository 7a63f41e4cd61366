"""The benchmark harness: gold answers score 100% and perturbed ones 0 on each benchmark, BFCL verdicts equal
bfcl-eval's own, nothing a model writes is evaluated, one-line errors, and an end-to-end `genenv eval` into a lake."""

from __future__ import annotations

import ast
import json
import shutil

import polars as pl
import pytest
from conftest import ROOT, genenv_cli, genenv_inline

from engine.benchmarks import BENCHMARKS, Ask, evaluate
from engine.benchmarks.apibank import APIBank
from engine.benchmarks.bfcl import BFCL
from engine.domains.calls import bfcl_checker
from lake import EVAL_ITEMS, EVAL_RESULTS, Lake, read_table

DATA = ROOT / "data"  # the repository's benchmark data
SAMPLE = {"bfcl": 6, "api-bank": 20, "bamboogle": 20, "alfworld": 3, "travelplanner": 8}  # BFCL: per category


class ScriptedAgent:
    """Answers each item from a table keyed by item id (multi-turn: by item id and turn)."""

    def __init__(self, answer):
        self.answer = answer

    def respond(self, asks: list[Ask], progress=None) -> list[str]:
        return [self.answer(a.item_id, a.turn) for a in asks]


def perturbed(name: str, item, gold: str, turn: int) -> str:
    """A wrong answer in the benchmark's own format."""
    if name == "bfcl":
        if item.category == "irrelevance":
            return f"[{item.data['functions'][0]['name']}()]"  # a call where none applies
        return gold.replace("[", "[not_", 1)  # the first call names a function that does not exist
    if name == "api-bank":
        return gold.replace("[", "[Not", 1)
    if name == "bamboogle":
        return "zzzz qqqq"
    if name == "alfworld":
        return "look"
    plan = ast.literal_eval(gold[gold.index("[") : gold.rindex("]") + 1])
    for day in plan:
        if day and day.get("accommodation", "-") != "-":
            day["accommodation"] = "Imaginary Inn, " + day["accommodation"].rpartition(",")[2].strip()
    return repr(plan)


@pytest.mark.unit
@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_gold_answers_score_100_and_perturbed_answers_score_0(name):
    benchmark = BENCHMARKS[name]()
    items = benchmark.load(DATA, SAMPLE[name])
    by_id = {item.item_id: item for item in items}

    def gold(item_id: str, turn: int) -> str:
        item = by_id[item_id]
        if name == "alfworld":
            return item.data["walkthrough"][turn]  # playing the walkthrough
        return benchmark.gold(item)

    report = evaluate(name, ScriptedAgent(gold), benchmark=benchmark, items=items)
    assert [r.score for r in report.results] == [1.0] * len(items), [r.detail for r in report.results if r.score < 1]
    assert report.metrics[benchmark.headline] == 1.0

    wrong = evaluate(
        name,
        ScriptedAgent(lambda item_id, turn: perturbed(name, by_id[item_id], benchmark.gold(by_id[item_id]), turn)),
        benchmark=benchmark,
        items=items,
    )
    assert [r.score for r in wrong.results] == [0.0] * len(items), [
        (r.item_id, r.response[:80]) for r in wrong.results if r.score
    ]
    assert wrong.metrics[benchmark.headline] == 0.0


@pytest.mark.unit
def test_bfcl_verdicts_equal_bfcl_evals_own_decoder_and_checker():
    from bfcl_eval.constants.enums import ReturnFormat
    from bfcl_eval.model_handler.utils import default_decode_ast_prompting

    checker, python = bfcl_checker()
    benchmark = BFCL(categories=("simple_python", "multiple", "parallel", "parallel_multiple"))
    items = benchmark.load(None, 4)
    outputs_checked = 0
    for item in items:
        gold = benchmark.gold(item)
        ((first_name, first_args),) = item.data["ground_truth"][0].items()
        outputs = [
            gold,
            f"```\n{gold}\n```",  # fenced, as small models write it
            f"```python\n{gold}\n```",  # fenced with its language: bfcl-eval's decoder cannot read it
            f"[{first_name}(" + ", ".join(repr(v[0]) for v in first_args.values() if v[0] != "") + ")]",  # positional
            gold.replace("(", "_v2(", 1),  # a function that does not exist
            gold[1:-1],  # without the list brackets
            f"[{first_name}()]",  # required arguments missing
            f"[{first_name}("
            + ", ".join(f"{k}='{json.dumps(v[0])}'" for k, v in first_args.items() if v[0] != "")
            + ")]",  # strings for everything
            gold + gold,  # two lists back to back: not one call list
            "I would call the function with those values.",
        ]
        for output in outputs:
            ours = benchmark.score(item, output).score
            try:
                decoded = default_decode_ast_prompting(output, ReturnFormat.PYTHON)
                well_formed = isinstance(decoded, list) and all(
                    isinstance(c, dict) and len(c) == 1 and isinstance(next(iter(c.values())), dict) for c in decoded
                )
                theirs = (
                    well_formed
                    and checker(
                        item.data["functions"], decoded, item.data["ground_truth"], python, item.category, "genenv"
                    )["valid"]
                )
            except Exception:  # bfcl-eval's runner counts any decoding error as an invalid answer
                theirs = False
            assert ours == float(theirs), (item.item_id, output)
            outputs_checked += 1
    assert outputs_checked == len(items) * 10


@pytest.mark.unit
def test_the_lenient_bfcl_reading_is_asked_for_and_named():
    strict, lenient = BFCL(categories=("simple_python",)), BFCL(categories=("simple_python",), reading="lenient")
    (item,) = strict.load(None, 1)
    fenced = f"```python\n{strict.gold(item)}\n```"
    assert strict.score(item, fenced).score == 0.0 and lenient.score(item, fenced).score == 1.0
    assert "bfcl-eval's default prompting decoder" in strict.scoring
    assert "lenient reading, not bfcl-eval's" in lenient.scoring
    with pytest.raises(ValueError, match="reading must be one of bfcl, lenient"):
        BFCL(reading="loose")


@pytest.mark.unit
def test_api_bank_reads_level_2_and_reports_each_level(tmp_path):
    rows = json.loads((DATA / "api-bank" / "level-1-api.json").read_text())
    (tmp_path / "api-bank").mkdir()
    (tmp_path / "api-bank" / "level-1-api.json").write_text(json.dumps(rows[:10]))
    (tmp_path / "api-bank" / "level-2-api.json").write_text(
        json.dumps(rows[10:20])
    )  # level 2's row format is level 1's
    benchmark = APIBank()
    items = benchmark.load(tmp_path, None)
    assert {item.category for item in items} == {"level-1", "level-2"}
    assert len({item.item_id for item in items}) == len(items)
    by_id = {item.item_id: item for item in items}
    # Right on level 1, wrong on level 2: each level's accuracy says so.
    answer = lambda item_id, turn: (
        benchmark.gold(by_id[item_id])
        if by_id[item_id].category == "level-1"
        else perturbed("api-bank", by_id[item_id], benchmark.gold(by_id[item_id]), turn)
    )
    report = evaluate("api-bank", ScriptedAgent(answer), benchmark=benchmark, items=items)
    assert report.metrics["accuracy_level_1"] == 1.0 and report.metrics["accuracy_level_2"] == 0.0
    assert 0 < report.metrics["accuracy"] < 1


MALFORMED = {  # what replaces a record (or the whole file), and what the one line must say
    "not_a_list": ('{"a": 1}', "not a list of records"),
    "a_null_record": ("null", "record 0 is a JSON NoneType, not an object"),
    "a_number_record": ("7", "record 0 is a JSON int, not an object"),
    "an_empty_record": ("{}", "record 0: "),
    "null_fields": (
        '{"Question": null, "Answer": null, "instruction": null, "input": null, "expected_output": null, '
        '"messages": null, "id": null, "question": null, "function": null}',
        "record 0: ",
    ),
    "nan_fields": (
        '{"Question": "q?", "Answer": NaN, "instruction": NaN, "input": "x", "expected_output": "y", '
        '"messages": NaN, "id": NaN, "question": [], "function": []}',
        "record 0: ",
    ),
}
MALFORMED_FILES = {  # benchmark: (file under data/, JSON lines?)
    "bamboogle": ("bamboogle/bamboogle.json", False),
    "api-bank": ("api-bank/level-1-api.json", False),
    "travelplanner": ("travelplanner/std_travelplanner.jsonl", True),
    "bfcl": ("BFCL_v4_simple_python.json", True),
}


@pytest.mark.unit
@pytest.mark.parametrize("variant", list(MALFORMED))
@pytest.mark.parametrize("name", list(MALFORMED_FILES))
def test_a_malformed_benchmark_record_is_one_line_naming_the_file_and_record(name, variant, tmp_path):
    """The benchmark's data copied, its first record (or, for not_a_list, the whole file) replaced: the load stops
    with DataMissing, never another exception, and a null or NaN answer is never taken as an item."""
    from engine.benchmarks import DataMissing

    relative, lines = MALFORMED_FILES[name]
    if name == "bfcl":
        source = BFCL().data_root(None)
        shutil.copytree(source, tmp_path / "bfcl")
        data = tmp_path / "bfcl"
    else:
        shutil.copytree(DATA / relative.split("/")[0], tmp_path / relative.split("/")[0])
        data = tmp_path
    record, message = MALFORMED[variant]
    path = data / relative
    if variant == "not_a_list" and not lines:
        path.write_text(record)
    elif lines:
        rows = path.read_text().splitlines()
        path.write_text("\n".join([record if variant != "not_a_list" else "[1]", *rows[1:]]))
        message = "record 0" if variant == "not_a_list" else message
    else:
        rows = json.loads(path.read_text())
        path.write_text("[" + ",".join([record, *map(json.dumps, rows[1:])]) + "]")
    bench = BFCL(("simple_python",)) if name == "bfcl" else BENCHMARKS[name]()
    with pytest.raises(DataMissing) as caught:
        bench.load(data, None)
    assert message in str(caught.value) and str(path) in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.unit
def test_arguments_a_model_writes_are_never_evaluated(tmp_path):
    benchmark = BFCL(categories=("simple_python",))
    (item,) = benchmark.load(None, 1)
    marker = tmp_path / "pwned"
    ((name, _),) = item.data["ground_truth"][0].items()
    for payload in (f"__import__('os').system('touch {marker}')", f"open('{marker}', 'w')", "10 + 0"):
        result = benchmark.score(item, f"[{name}(base={payload}, height=5)]")
        assert result.score == 0.0 and "not a literal" in result.detail
    assert not marker.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (("--benchmark", "mmlu", "--model", "tiny"), "unknown benchmark 'mmlu'"),
        (
            ("--benchmark", "bamboogle", "--model", "tiny", "--data", "/no/such/folder"),
            "--data /no/such/folder is not a folder",
        ),
        (
            ("--benchmark", "bamboogle", "--model", "tiny", "--data", str(ROOT / "tests")),
            "bamboogle/bamboogle.json does not exist",
        ),
        (("--benchmark", "bfcl", "--model", "no-such-model-please"), "no-such-model-please"),
        (("--benchmark", "bfcl", "--model", "agent:v3"), "no agent checkpoint version 3"),
        (("--benchmark", "bamboogle", "--model", "tiny", "--limit", "0"), "--limit must be >= 1"),
    ],
)
@pytest.mark.integration
def test_bad_benchmarks_data_and_models_give_one_line_errors(tmp_path, args, message):
    result = genenv_inline("eval", *args, "--lake", str(tmp_path / "lake"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.integration
def test_missing_data_names_the_file_and_where_to_get_it(tmp_path):
    (tmp_path / "alfworld").mkdir()
    for name, needle in (
        ("travelplanner", "std_travelplanner.jsonl"),
        ("api-bank", "level-1-api.json"),
        ("alfworld", "no game.tw-pddl files"),
    ):
        result = genenv_inline(
            "eval", "--benchmark", name, "--model", "tiny", "--data", str(tmp_path), "--lake", str(tmp_path / "lake")
        )
        assert result.returncode == 2 and needle in result.stderr and "README" in result.stderr, result.stderr


@pytest.mark.integration
def test_genenv_eval_writes_its_results_to_the_lake(tmp_path):
    root = tmp_path / "lake"
    result = genenv_cli(
        "eval",
        "--benchmark",
        "bamboogle",
        "--model",
        "tiny",
        "--limit",
        "3",  # data/ by default
        "--lake",
        str(root),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lake = Lake(root, create=False)
    results = read_table(lake, EVAL_RESULTS)
    assert set(results["metric"]) >= {"exact_match", "f1"} and set(results["benchmark"]) == {"bamboogle"}
    assert results["model"][0] == "tiny" and (results["items"] == 3).all()
    items = read_table(lake, EVAL_ITEMS)
    assert items.height == 3 and items["eval_id"].n_unique() == 1
    assert items["eval_id"][0] in set(results["eval_id"])
    assert results.filter(pl.col("metric") == "exact_match")["value"][0] == pytest.approx(items["score"].mean())


@pytest.mark.e2e
def test_a_registered_checkpoint_is_evaluated_by_version(quick_run, tmp_path):
    lake, _ = quick_run
    copy = tmp_path / "lake"  # the eval tables are written into a copy: the shared run's lake stays as it was
    shutil.copytree(lake.root, copy)
    result = genenv_cli(
        "eval", "--benchmark", "bfcl", "--model", "agent:latest", "--limit", "1", "--lake", str(copy), timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    results = read_table(Lake(copy, create=False), EVAL_RESULTS)
    assert results["model_version"][0].startswith("agent:v") and results["model"][0] == "agent:latest"


@pytest.mark.integration
def test_an_agent_answering_gibberish_wins_no_alfworld_game_and_games_below_a_symlink_are_found(tmp_path):
    """A reply that names no admissible command costs the step ("Nothing happens."), as in ALFWorld itself: an
    agent writing random letters wins none of the shipped games (every 34th of them: each game is a whole episode of
    TextWorld steps, about 3 s, and the games differ only in their layout). The loader follows symlinked folders."""
    import random

    benchmark = BENCHMARKS["alfworld"]()
    items = benchmark.load(DATA, None)
    assert len(items) == 134
    rng = random.Random(0)
    gibberish = ScriptedAgent(
        lambda item_id, turn: "".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randrange(3, 30)))
    )
    report = evaluate("alfworld", gibberish, benchmark=benchmark, items=items[::34])
    assert report.metrics["success"] == 0.0, [r.item_id for r in report.results if r.score]
    assert all(r.response.startswith("(none: reply") for r in report.results)

    linked = tmp_path / "data" / "alfworld"
    linked.mkdir(parents=True)
    first = sorted(p for p in (DATA / "alfworld").iterdir() if p.is_dir())[0]
    (linked / first.name).symlink_to(first.resolve(), target_is_directory=True)
    found = benchmark.load(tmp_path / "data", None)
    assert found and all(first.name in item.data["path"] for item in found)
