"""The curriculum's measures (engine/lineage/measures.py), recomputed here from the lake's rows with Polars alone,
equal what metrics.json, the report and `genenv audit epoch` say.

Two lakes: toolcall-shaped epochs whose tasks record the levels their requests offered, sent through the real
broker, ingest and GX suites (the tiny simulator writes no valid toolcall task, so a quick toolcall run would
have nothing to measure); and the quick arith run of conftest.py, whose report the sync loop writes."""

from __future__ import annotations

import json
import math
import random

import polars as pl
import pytest
from conftest import genenv_inline
from demo_events import publish

from engine.coevolution import load_config
from engine.lineage import metrics_from_lake, write_report
from lake import Lake, ingest, read_table, silver
from streams import RewardScored, RolloutCompleted, TaskGenerated

RUN = "toolcall-measured"


def toolcall_epochs(epochs: int = 2, tasks: int = 6, group: int = 4) -> list:
    """Tasks that chose a level among 3 offered (higher levels, later epochs), solved less often the harder."""
    rng = random.Random(5)
    events = []
    for epoch in range(epochs):
        for t in range(tasks):
            task_id = f"{RUN}-e{epoch}-t{t}"
            offered = sorted(rng.sample(range(5), 3))
            level = offered[-1] if rng.random() < 0.3 + 0.4 * epoch else offered[0]
            events.append(
                TaskGenerated(
                    run_id=RUN,
                    epoch=epoch,
                    task_id=task_id,
                    batch_id=f"{RUN}-e{epoch}-b0",
                    domain="toolcall",
                    env_model_version="1",
                    sim_prompt="Pick a task.",
                    raw_generation="What is the weather in Oslo?",
                    task_prompt="What is the weather in Oslo?",
                    difficulty_json=json.dumps({"level": level}),
                    offered_json=json.dumps(offered),
                    producer="simulator",
                )
            )
            for g in range(group):
                ok = rng.random() < 1 - level / 5
                events.append(
                    RolloutCompleted(
                        run_id=RUN,
                        epoch=epoch,
                        rollout_id=f"{task_id}-r{g}",
                        task_id=task_id,
                        group_index=g,
                        agent_model_version="1",
                        prompt="p",
                        completion="c",
                        completion_token_ids=[1],
                        behaviour_logprobs=[-0.1],
                        producer="rollout",
                    )
                )
                events.append(
                    RewardScored(
                        run_id=RUN,
                        epoch=epoch,
                        rollout_id=f"{task_id}-r{g}",
                        task_id=task_id,
                        reward=float(ok),
                        success=ok,
                        checker_detail="scripted",
                        producer="reward",
                    )
                )
    return events


@pytest.fixture
def measured_lake(broker, lake, runner) -> Lake:
    publish(broker.bootstrap, toolcall_epochs())
    ingest(lake, broker.bootstrap, idle_exit_s=1.5, runner=runner)
    return lake


def recomputed(lake: Lake, run_id: str, feature: str) -> dict[int, dict]:
    """Each epoch's measures, from silver/task and silver/reward, without genenv's code."""
    generated = pl.col("producer") != "warm-start"
    of_run = (pl.col("run_id") == run_id) & generated
    tasks = (
        read_table(lake, silver("task"))
        .filter(of_run & pl.col("valid"))
        .with_columns(
            level=pl.col("difficulty_json").str.json_path_match(f"$.{feature}").cast(pl.Float64),
            offered=pl.col("offered_json").str.json_decode(pl.List(pl.Float64)),
        )
    )
    rewards = read_table(lake, silver("reward")).filter(of_run & (pl.col("producer") != "guidance"))  # the agent's own
    out = {}
    for epoch in sorted(set(read_table(lake, silver("task")).filter(of_run)["epoch"])):
        t = tasks.filter(pl.col("epoch") == epoch)
        r = rewards.filter(pl.col("epoch") == epoch)
        offered = t.filter(pl.col("offered").list.len() > 0)
        groups = r.group_by("task_id").agg(pl.len().alias("n"), pl.col("success").sum().alias("s"))
        informative = groups.filter((pl.col("s") > 0) & (pl.col("s") < pl.col("n"))).height
        by_level = (
            r.join(t.select("task_id", "level"), on="task_id")
            .group_by("level")
            .agg(pl.col("success").mean())
            .sort("level")
        )
        out[epoch] = {
            "selection_bias": (offered["level"] - offered["offered"].list.mean()).mean() if offered.height else None,
            "informative_groups_per_100": 100 * informative / r.height if r.height else None,
            "success_by_level": {f"{level:g}": s for level, s in by_level.iter_rows()},
            "chosen_levels": {f"{level:g}": n for level, n in t.group_by("level").len().sort("level").iter_rows()},
            "offered_levels": {
                f"{level:g}": n
                for level, n in offered.select(pl.col("offered").explode())
                .group_by("offered")
                .len()
                .sort("offered")
                .iter_rows()
            },
        }
    return out


def same(want, got) -> bool:
    """Equal to the 4 decimals the measures keep; a measure with nothing to measure is NaN (null in JSON)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and want.keys() == got.keys() and all(same(v, got[k]) for k, v in want.items())
    if want is None:
        return got is None or (isinstance(got, float) and math.isnan(got))
    return got is not None and abs(want - got) < 1e-3


def check_epochs(epochs: list[dict], expected: dict[int, dict]) -> None:
    assert [m["epoch"] for m in epochs] == sorted(expected)
    for m in epochs:
        for name, want in expected[m["epoch"]].items():
            assert same(want, m[name]), (m["epoch"], name, want, m[name])


@pytest.mark.integration
def test_measures_from_the_lake_equal_metrics_json_the_report_and_the_audit(measured_lake, tmp_path):
    expected = recomputed(measured_lake, RUN, "level")
    assert all(e["offered_levels"] and e["selection_bias"] is not None for e in expected.values())

    metrics = metrics_from_lake(measured_lake, RUN)
    page = write_report(
        tmp_path, RUN, load_config("quick", None, ["domain=toolcall"]), metrics, 0.0, measured_lake.root
    )
    written = json.loads((tmp_path / "metrics.json").read_text())
    check_epochs(written["epochs"], expected)
    text = page.read_text()
    assert "| selection bias |" in text and "Success per level" in text
    for plot in ("selection.png", "calibration.png"):
        assert (tmp_path / plot).stat().st_size > 0 and plot in text

    for epoch in expected:
        audit = genenv_inline("audit", "epoch", str(epoch), "--lake", measured_lake.root, "--run", RUN, "--json")
        assert audit.returncode == 0, audit.stderr[-2000:]
        check_epochs([{**json.loads(audit.stdout), "epoch": epoch}], {epoch: expected[epoch]})


@pytest.mark.e2e
def test_a_sync_runs_report_carries_the_measures_of_its_lake(quick_run):
    lake, _ = quick_run
    run_id = read_table(lake, silver("task"))["run_id"][0]
    written = json.loads((lake.files.local(f"reports/{run_id}") / "metrics.json").read_text())
    expected = recomputed(lake, run_id, "digits")  # arith's difficulty feature; arith offers no choice of level
    check_epochs(written["epochs"], expected)
    assert all(m["selection_bias"] is None and not m["offered_levels"] for m in written["epochs"])  # strict JSON: null


@pytest.mark.unit
def test_the_ablation_summary_pairs_seeds_and_bounds_each_mean():
    """Per mode the mean over seeds inside its bootstrap interval; the paired difference is taken seed by seed."""
    from engine.coevolution.experiment import BASELINE, MEASURES, summarise

    rng = random.Random(3)

    def run(seed: int, lift: float) -> dict:
        return {
            "seed": seed,
            "initial": 0.5,
            "validation": [0.5, 0.5 + lift + 0.01 * seed],
            "in_band": [0.2, 0.4 + lift, 0.6 + lift],
            "selection_bias": [0.1 * seed, math.nan, 0.1 * seed + lift],
            "informative": [rng.uniform(0, 10) for _ in range(3)],
            "bfcl": 0.2 + lift,
        }

    results = {"genenv": [run(s, 0.1) for s in range(5)], BASELINE: [run(s, 0.0) for s in range(5)]}
    table = summarise(results)
    for measures in table["modes"].values():
        assert set(measures) == set(MEASURES)
        for stats in measures.values():
            assert stats["n"] == 5 and stats["low"] <= stats["mean"] <= stats["high"]
    gain = table["modes"]["genenv"]["validation_gain"]
    assert gain["mean"] == pytest.approx(0.12)  # 0.1 + the mean of 0.01 x seed
    assert table["modes"]["genenv"]["in_band_last_half"]["mean"] == pytest.approx(0.6)  # epochs 1 and 2 of 3
    paired = table[f"paired_vs_{BASELINE}"]["genenv"]
    # Every seed gains exactly 0.1 over its own baseline run: the paired interval is that point, though the
    # seeds' spread widens each mode's own interval.
    assert paired["validation_gain"] == {
        "n": 5,
        "mean": pytest.approx(0.1),
        "low": pytest.approx(0.1),
        "high": pytest.approx(0.1),
    }
    assert gain["high"] - gain["low"] > 0.01
    assert paired["selection_bias_per_epoch"]["mean"] == pytest.approx(0.05)  # +0.1 over two epochs, NaN left out


@pytest.mark.e2e
def test_an_ablation_runs_its_modes_from_one_warm_start_and_summarises_them(lake, tmp_path):
    """Two seeds of genenv and genenv-random on the quick profile in two jobs side by side (each with its own
    broker and lake): each seed's modes start from the same warm-started checkpoints and the same validation,
    the merged runs.json holds both seeds in order, and the table's figures are those of runs.json."""
    from engine.coevolution import run_ablation
    from engine.coevolution.experiment import BASELINE, MEASURES
    from engine.lineage import with_measures

    # 10 warm-start passes, not the quick profile's 150: what is checked is where each mode starts and how the table
    # is made, not what the tiny models learnt (an epoch whose simulator writes no valid task still validates).
    base = load_config("quick", None, ["epochs=2", "warm_start_epochs=10"])
    table = run_ablation(
        base, 2, lake, "", tmp_path, say=lambda *_: None, modes=("genenv", BASELINE), measure=with_measures, jobs=2
    )
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert [r["seed"] for r in runs["genenv"]] == [r["seed"] for r in runs[BASELINE]] == [0, 1]
    for mine, theirs in zip(runs["genenv"], runs[BASELINE]):
        assert mine["initial"] == theirs["initial"] and len(mine["validation"]) == 2
    for job, seed in ((0, 0), (1, 1)):  # seed i ran in job i, whose lake holds its runs and nothing else
        registry = read_table(Lake(f"{lake.root}/job{job}", create=False), "registry/checkpoints")
        mine = {runs["genenv"][seed]["run_id"], runs[BASELINE][seed]["run_id"]}
        assert runs["genenv"][seed]["run_id"] in set(registry["run_id"]) <= mine
        warm = registry.filter(pl.col("metrics_json").str.contains('"warm_start": true'))
        assert warm.height == 2  # one warm start of each role per seed, not per mode
    gains = [r["validation"][-1] - r["initial"] for r in runs["genenv"]]
    assert table["modes"]["genenv"]["validation_gain"]["mean"] == pytest.approx(sum(gains) / 2)
    paired = [a["validation"][-1] - b["validation"][-1] for a, b in zip(runs["genenv"], runs[BASELINE])]
    assert table[f"paired_vs_{BASELINE}"]["genenv"]["final_validation"]["mean"] == pytest.approx(sum(paired) / 2)
    assert set(json.loads((tmp_path / "ablation.json").read_text())["modes"]["genenv"]) == set(MEASURES)
    answers = sorted(path.name for path in tmp_path.glob("**/validation-*.jsonl"))  # moved out of the job folders
    assert answers == sorted(f"validation-{mode}-seed{seed}.jsonl" for mode in runs for seed in (0, 1))
    assert (tmp_path / "ablation.png").stat().st_size > 0 and "paired" in (tmp_path / "ablation.md").read_text().lower()


@pytest.mark.e2e
def test_an_ablations_later_modes_keep_the_ptx_term_of_the_shared_warm_start(broker, lake, tmp_path):
    """The modes after the first continue its warm start, and their GRPO updates hold the PPO-ptx term on that warm
    start's reference answers: with their own run's rows as the anchor they had none (ptx_rows 0), and in the
    ablation of the e30 default genenv-random's agent then fell from 0.43 to 0.22 (docs/RESULTS.md). seeds-only
    as the later mode: its tasks are valid whatever the tiny simulator writes, so it has updates to look at.

    Before the later mode the ablation weighs the disk it will need: what the first run wrote past its warm start,
    which the later run continues and does not write again (counting it stopped a 5-seed ablation that fitted)."""
    from engine.coevolution import run_ablation
    from lake import checkpoint_path
    from lake.cache import size

    base = load_config("quick", None, ["epochs=1", "warm_start_epochs=10"])
    said = []
    run_ablation(base, 1, lake, broker.bootstrap, tmp_path, say=said.append, modes=("genenv", "seeds-only"))
    first = json.loads((tmp_path / "runs.json").read_text())["genenv"][0]
    (later,) = json.loads((tmp_path / "runs.json").read_text())["seeds-only"]
    registry = read_table(lake, "registry/checkpoints")
    updates = registry.filter((pl.col("model_kind") == "agent") & (pl.col("run_id") == later["run_id"]))
    ptx = [json.loads(m)["ptx_rows"] for m in updates["metrics_json"]]
    assert ptx and all(ptx), ptx

    def written(rows: pl.DataFrame) -> int:
        return sum(
            size(lake.files.local(checkpoint_path(kind, v))) for kind, v in rows.select("model_kind", "version").rows()
        )

    mine = registry.filter(pl.col("run_id") == first["run_id"])
    warm = mine.filter(pl.col("metrics_json").str.contains('"warm_start": true'))
    past_warm_start = written(mine) - written(warm)
    assert written(warm) > 0  # (the tiny simulator's tasks may leave the first run no update past it: 0 bytes)
    (line,) = [text for text in said if text.startswith("[ablation] seeds-only")]
    estimate = float(line.split("about ")[1].split(" GB")[0]) * 1e9  # 3 significant figures
    assert estimate == pytest.approx(past_warm_start, rel=0.01, abs=1000), (line, past_warm_start, written(warm))


@pytest.mark.e2e
def test_an_ablation_stops_before_a_run_when_the_runs_to_come_would_not_fit(broker, lake, tmp_path, monkeypatch):
    """Once a run has ended, the runs still to come, each writing what it wrote, are weighed against the disk's free
    space: with less free than that the ablation stops with one line (a LakeError, which the CLI prints as one)
    before the next run, and runs.json keeps the run that ended."""
    import shutil
    from types import SimpleNamespace

    from engine.coevolution import run_ablation
    from lake import LakeError

    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=2**40, used=2**40 - 1, free=1))
    base = load_config("quick", None, ["epochs=1", "warm_start_epochs=10"])
    with pytest.raises(LakeError, match=r"runs still to come would write about .* GB of checkpoints"):
        run_ablation(base, 2, lake, broker.bootstrap, tmp_path, say=lambda *_: None, modes=("genenv", "seeds-only"))
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert [r["seed"] for r in runs["genenv"]] == [0] and runs["seeds-only"] == []


@pytest.mark.e2e
def test_an_ablation_with_a_shared_warm_start_warm_starts_once_for_all_its_seeds(broker, lake, tmp_path):
    """--share-warm-start: the second seed's runs start from the first seed's warm-started checkpoints and its
    validation before training, so the lake holds one warm start of each role however many seeds ran. seeds-only as
    the later mode: its tasks are valid whatever the tiny simulator writes, so it has updates whose parents to read."""
    from engine.coevolution import run_ablation

    base = load_config("quick", None, ["epochs=1", "warm_start_epochs=10"])
    modes = ("genenv", "seeds-only")
    run_ablation(base, 2, lake, broker.bootstrap, tmp_path, say=lambda *_: None, modes=modes, share_warm_start=True)
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert [r["seed"] for r in runs["seeds-only"]] == [0, 1]
    assert len({r["initial"] for mode in modes for r in runs[mode]}) == 1
    registry = read_table(lake, "registry/checkpoints")
    warm = registry.filter(pl.col("metrics_json").str.contains('"warm_start": true'))
    assert warm.height == 2 and set(warm["run_id"]) == {runs["genenv"][0]["run_id"]}  # one of each role, by seed 0
    warm_agent = warm.filter(pl.col("model_kind") == "agent")["version"][0]
    later = registry.filter((pl.col("run_id") == runs["seeds-only"][1]["run_id"]) & (pl.col("model_kind") == "agent"))
    assert later["parent_version"].to_list() == [warm_agent]  # seed 1's one update, on seed 0's warm start
    for mode in modes:  # each run's held-out answers, the same items before training in every run
        for run in runs[mode]:
            rows = (tmp_path / f"validation-{mode}-seed{run['seed']}.jsonl").read_text().splitlines()
            answers = [json.loads(row) for row in rows]
            for when, accuracy in (("before", run["initial"]), ("after", run["validation"][-1])):
                assert sum(a[when]["success"] for a in answers) / len(answers) == pytest.approx(accuracy, abs=1e-3)
