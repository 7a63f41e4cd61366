"""Audit and replay of a quick run (tiny models, the real broker and lake): task and checkpoint lineage, epoch
replay bit for bit, rescoring with a changed checker, one-line errors, and the web view in a real browser."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import free_port, genenv_cli, genenv_inline, http_server

from engine.domains import Verdict
from engine.domains.arith import Arith
from engine.lineage import PLOTS, replay_epoch
from lake import CHECKPOINTS, Lake, read_pool, read_table, silver

pytestmark = pytest.mark.e2e


def run_of(lake: Lake) -> str:
    return read_table(lake, silver("task"))["run_id"][0]


def test_replaying_every_epoch_reproduces_its_checkpoints_bit_for_bit(quick_run):
    lake, _ = quick_run
    registered = read_table(lake, CHECKPOINTS).filter(pl.col("run_id") == run_of(lake))
    assert registered.height >= 3  # warm start (agent, env) and at least one epoch's update
    # The first epoch as a user replays it (its warm starts and first update); the later ones through the function
    # the command calls, in this process: a new interpreter's imports are seconds of a 2-core machine each.
    first, *later = sorted(set(read_table(lake, silver("task"))["epoch"].to_list()))
    result = genenv_cli("replay", "--epoch", str(first), "--lake", lake.root, "--json", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    answer = json.loads(result.stdout[result.stdout.index("{") :])
    assert answer["ok"]
    checkpoints = answer["checkpoints"]
    for epoch in later:
        result = replay_epoch(lake, epoch, run_of(lake), say=lambda _: None)
        assert result.ok
        checkpoints += [dataclasses.asdict(c) for c in result.checkpoints]  # the command's --json is these fields
    for c in checkpoints:
        assert c["replayed_sha256"] == c["recorded_sha256"], c
    replayed = {(c["kind"], c["version"]) for c in checkpoints}
    assert replayed == {(r["model_kind"], r["version"]) for r in registered.iter_rows(named=True)}
    # Among them, GRPO updates that changed the weights (not only warm starts): the replay reproduced real training.
    sha = {(r["model_kind"], r["version"]): r["sha256"] for r in registered.iter_rows(named=True)}
    moved = [
        r
        for r in registered.iter_rows(named=True)
        if r["model_kind"] == "agent"
        and r["parent_version"]
        and sha[("agent", r["version"])] != sha[("agent", r["parent_version"])]
    ]
    assert moved, "no GRPO update changed the agent's weights: the replay test would not test training"
    # ... and one of them continued its parent's optimiser (optimizer.pt), which the replay started from too.
    continued = [json.loads(r["metrics_json"])["optimizer"] for r in registered.iter_rows(named=True)]
    assert any(o.startswith("continued at step") for o in continued), continued


def test_replay_shows_the_first_difference_when_a_checkpoint_cannot_be_reproduced(quick_run, tmp_path):
    """The newest GRPO update of the agent, with its recorded learning rate changed: replaying its epoch names it and
    its first differing tensor. (The newest, not the warm start: an epoch after the first retrains no warm start.)"""
    lake, _ = quick_run
    copy = tmp_path / "lake"
    shutil.copytree(lake.root, copy)
    agent = read_table(lake, CHECKPOINTS).filter((pl.col("model_kind") == "agent") & (pl.col("run_id") == run_of(lake)))
    newest = agent.sort("version").row(-1, named=True)
    lineage_file = copy / "checkpoints" / "agent" / f"v{newest['version']}" / "genenv.json"  # its recorded config
    lineage = json.loads(lineage_file.read_text())
    lineage["config"]["learning_rate"] *= 10
    lineage_file.write_text(json.dumps(lineage))
    result = genenv_cli("replay", "--epoch", str(newest["epoch"]), "--lake", str(copy), timeout=600)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    said = " ".join(result.stdout.split())  # rich wraps long lines
    assert f"agent v{newest['version']}: DIFFERS" in said and "first differing tensor" in said


def test_audit_of_a_task_lists_exactly_the_rollouts_and_rewards_the_lake_holds(quick_run):
    lake, _ = quick_run
    tasks = read_table(lake, silver("task")).filter(pl.col("valid") & (pl.col("producer") != "warm-start"))
    rollouts, rewards = read_table(lake, silver("rollout")), read_table(lake, silver("reward"))
    batches = read_table(lake, silver("batch"))
    task_id = tasks.sort("task_id")["task_id"][0]
    result = genenv_inline("audit", "task", task_id, "--lake", lake.root, "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)

    expected = (
        rollouts.filter(pl.col("task_id") == task_id)
        .join(rewards, on="rollout_id", suffix="_r")
        .select("rollout_id", "completion", "reward", "success")
    )
    got = pl.DataFrame(answer["rollouts"]).select("rollout_id", "completion", "reward", "success")
    assert got.sort("rollout_id").equals(expected.sort("rollout_id"))
    batch = batches.filter(pl.col("task_ids").list.contains(task_id))
    assert [b["p_hat"] for b in answer["batch"]] == batch["p_hat"].to_list()
    assert answer["raw_generation"] == tasks.filter(pl.col("task_id") == task_id)["raw_generation"][0]
    assert {p["pool"] for p in answer["pools"]} == {"gold/d_env", "gold/d_train"}
    assert any(c["kind"] == "agent" and c["use"].startswith("trained on (") for c in answer["checkpoints"])


def test_audit_of_a_task_says_whether_each_update_trained_on_it_by_that_updates_options(quick_run, broker, tmp_path):
    """An update's use of a task is the selection its trainer made with the options the update recorded. GRPO: a
    group whose rewards all agree is trained on where `filter_groups` is off (the quick profile) and left out where
    it is on. RWR: a row outside the band is trained on where `band_only` is off (the default) and left out where it
    is on, and a generation sampled at another temperature than the update scored at is left out."""
    from engine.coevolution import publish_checkpoint
    from lake import ingest
    from trainers import RWRConfig, registry, train_update

    lake, _ = quick_run
    copy = Lake(shutil.copytree(lake.root, tmp_path / "lake"), create=False)

    def uses(task_id: str, kind: str) -> dict[int, str]:
        result = genenv_inline("audit", "task", task_id, "--lake", copy.root, "--json")
        assert result.returncode == 0, result.stderr
        return {c["version"]: c["use"] for c in json.loads(result.stdout)["checkpoints"] if c["kind"] == kind}

    def recorded(kind: str, version: int, **options) -> None:  # as if the update had run with these options
        path = Path(copy.root) / "checkpoints" / kind / f"v{version}" / "genenv.json"
        lineage = json.loads(path.read_text())
        path.write_text(json.dumps({**lineage, "config": {**lineage["config"], **options}}))

    rollouts = read_pool(copy, "d_train").filter(pl.col("agent_model_version") != "seed")
    alike = rollouts.group_by("task_id").agg(rewards=pl.col("reward").n_unique()).filter(pl.col("rewards") == 1)
    task_id, agent = next((t, u) for t in alike.sort("task_id")["task_id"] if (u := uses(t, "agent")))
    version = min(agent)
    assert agent[version] == f"trained on ({rollouts.filter(pl.col('task_id') == task_id).height} of its rollouts)"
    recorded("agent", version, filter_groups=True)
    assert uses(task_id, "agent")[version] == "left out (its rollouts' rewards all agree)"

    # An update from the simulator's warm start on every generation since, out of the band too (`band_only` false,
    # the default's; the quick profile's leaves its rows out), registered through the broker as a run's are.
    generated = read_pool(copy, "d_env").filter(pl.col("env_model_version") != "seed")
    options = RWRConfig(band_only=False, temperature=1.0, learning_rate=1e-3, per_device_train_batch_size=8)
    update = train_update("env", copy, options, parent_version=registry(copy, "env")["version"].min())
    publish_checkpoint(copy, broker.bootstrap, update, run_id=generated["run_id"][0], epoch=1)
    ingest(copy, broker.bootstrap, idle_exit_s=1.5)
    task_id = generated.filter(pl.col("valid") & pl.col("filtered")).sort("task_id")["task_id"][0]
    assert uses(task_id, "env")[update.version] == "trained on"
    recorded("env", update.version, band_only=True)
    assert uses(task_id, "env")[update.version] == "left out (filtered: outside the alpha band)"
    recorded("env", update.version, band_only=False, temperature=0.5)  # the quick run samples its simulator at 1.0
    assert uses(task_id, "env")[update.version] == "left out (sampled at another temperature than the update scored at)"


def test_audit_of_checkpoints_and_epochs_follows_the_registry(quick_run):
    lake, _ = quick_run
    registered = read_table(lake, CHECKPOINTS).filter(pl.col("model_kind") == "agent")
    newest = int(registered["version"].max())
    result = genenv_inline("audit", "checkpoint", "agent", str(newest), "--lake", lake.root, "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert [v["version"] for v in answer["lineage"]] == list(range(newest, 0, -1))  # back to the base model
    assert answer["base_model"] == "tiny" and answer["lineage"][-1]["parent_version"] == 0
    assert answer["lineage"][-1]["warm_start"] and answer["lineage"][-1]["seed_rows"] > 0

    result = genenv_inline("audit", "epoch", "0", "--lake", lake.root, "--json")
    assert result.returncode == 0, result.stderr
    epoch = json.loads(result.stdout)
    tasks = read_table(lake, silver("task")).filter((pl.col("epoch") == 0) & (pl.col("producer") != "warm-start"))
    assert epoch["tasks_generated"] == tasks.height
    assert epoch["valid_share"] == pytest.approx(tasks["valid"].mean(), abs=1e-4)
    assert {(c["kind"], c["version"]) for c in epoch["checkpoints"]} == {
        (r["model_kind"], r["version"])
        for r in read_table(lake, CHECKPOINTS).filter(pl.col("epoch") == 0).iter_rows(named=True)
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (("audit", "task", "no-such-task"), "no task 'no-such-task'"),
        (("audit", "checkpoint", "agent", "99"), "no agent checkpoint version 99"),
        (("audit", "checkpoint", "critic", "1"), "unknown model kind 'critic'"),
        (("audit", "epoch", "99"), "has no epoch 99"),
        (("replay", "--epoch", "99"), "has no epoch 99"),
        (("audit", "epoch", "0", "--run", "nobody"), "no run 'nobody'"),
    ],
)
def test_unknown_ids_and_versions_give_one_line_errors(quick_run, args, message):
    lake, _ = quick_run
    result = genenv_inline(*args, "--lake", lake.root)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


class ArithThatDislikesEights(Arith):
    """A deliberately changed checker: any answer containing the digit 8 has its verdict turned around."""

    def check(self, task, answer: str) -> Verdict:
        verdict = super().check(task, answer)
        if "8" in answer:
            return Verdict(1.0 - verdict.reward, not verdict.success, "changed checker")
        return verdict


def test_rescore_with_a_changed_checker_reports_exactly_the_rows_whose_reward_changes(quick_run):
    lake, _ = quick_run
    run_id = run_of(lake)
    # The newest epoch with an answer containing an 8: an epoch after the first retrains no warm start (45 s).
    answers = read_table(lake, silver("rollout")).filter(pl.col("producer") != "warm-start")
    epoch = answers.filter(pl.col("completion").str.contains("8"))["epoch"].max()
    assert epoch is not None, "the quick run's answers contain no 8: pick another changed checker"
    result = replay_epoch(lake, epoch, run_id, rescore=True, domain=ArithThatDislikesEights(), say=lambda _: None)
    assert result.ok

    generated = (pl.col("epoch") == epoch) & (pl.col("producer") != "warm-start")
    rollouts = read_table(lake, silver("rollout")).filter(generated)
    rewards = read_table(lake, silver("reward")).filter(generated)
    scored = rollouts.join(rewards.select("rollout_id", "reward", "success"), on="rollout_id")
    expected = set(scored.filter(pl.col("completion").str.contains("8"))["rollout_id"])
    assert {c.row_id for c in result.changes if c.table == "reward"} == expected
    assert result.rescored_rollouts == rollouts.height

    # Batches: a group's p_hat changes exactly when its flipped successes change its count of successes.
    flipped = scored.with_columns(
        pl.when(pl.col("completion").str.contains("8"))
        .then(~pl.col("success"))
        .otherwise(pl.col("success"))
        .alias("new_success")
    )
    batches = read_table(lake, silver("batch")).filter(generated)
    changed = set()
    for b in batches.iter_rows(named=True):  # scored on the agent's own rollouts: guide rows are rescored, not counted
        rows = flipped.filter(pl.col("task_id").is_in(b["task_ids"]) & (pl.col("producer") != "guidance"))
        if int(rows["new_success"].sum()) != b["n_success"]:
            changed.add(b["batch_id"])
    assert {c.row_id for c in result.changes if c.table == "batch" and c.field == "p_hat"} == changed


# -- the web view, in a real headless browser ------------------------------------------------------------------


@pytest.fixture
def ui_server(quick_run):
    lake, _ = quick_run
    port = free_port()
    process = http_server(
        [sys.executable, "-m", "engine.cli", "ui", "--lake", lake.root, "--port", str(port)], port, "genenv ui"
    )
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("GENENV_REQUIRE_BROWSER"):  # CI installs them: there, a missing browser is a failure
            pytest.fail("chromium and chromedriver are not installed (Debian packages chromium, chromium-driver)")
        pytest.skip("chromium and chromedriver are not installed (Debian packages chromium, chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,1200",
    ):
        options.add_argument(flag)
    session = webdriver.Chrome(service=Service(driver), options=options)
    yield session
    session.quit()


def test_the_browser_finds_a_task_by_id_and_sees_its_rollouts(quick_run, ui_server, browser):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def arrive(title: str) -> None:
        """Wait until the browser shows the page titled `title` (a click navigates asynchronously)."""
        WebDriverWait(browser, 30, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(
            lambda b: b.find_element(By.TAG_NAME, "h1").text == title
        )

    lake, _ = quick_run
    rollouts = read_table(lake, silver("rollout")).filter(pl.col("producer") != "warm-start")
    task_id = rollouts.sort("rollout_id")["task_id"][0]
    expected = sorted(rollouts.filter(pl.col("task_id") == task_id)["rollout_id"].to_list())

    browser.get(ui_server)
    arrive("genenv runs")
    assert run_of(lake) in browser.find_element(By.ID, "runs").text
    browser.find_element(By.ID, "task-search").send_keys(task_id)
    browser.find_element(By.ID, "find").click()
    arrive(f"task {task_id}")
    rows = browser.find_elements(By.CSS_SELECTOR, "#rollouts tr.rollout")
    assert sorted(row.find_elements(By.TAG_NAME, "td")[0].text for row in rows) == expected

    browser.find_element(By.LINK_TEXT, run_of(lake)).click()  # the run page: epochs, plots, tasks
    arrive(f"run {run_of(lake)}")
    assert browser.find_elements(By.CSS_SELECTOR, "#epochs tr")
    plots = browser.find_elements(By.TAG_NAME, "img")
    WebDriverWait(browser, 30).until(
        lambda b: all(b.execute_script("return arguments[0].complete", img) for img in plots)
    )
    assert len(plots) == len(PLOTS) and all(
        browser.execute_script("return arguments[0].naturalWidth", img) > 0 for img in plots
    )
    browser.find_element(By.LINK_TEXT, "quarantine").click()
    arrive("quarantine")
    browser.find_element(By.LINK_TEXT, "evals").click()
    arrive("evals")
    assert browser.find_element(By.ID, "evals").text  # "no evaluations yet" or the results


def test_the_web_view_answers_every_url_its_pages_link_to_when_a_parent_is_not_registered(quick_run, tmp_path):
    """A copy of the quick run's lake with the agent's warm start (every later agent's ancestor) taken out of the
    registry: every page and image that a page links to answers 200, and the lineage says where it stops."""
    import re
    from urllib.parse import urljoin, urlsplit

    from deltalake import DeltaTable

    from engine.lineage.ui import create_app

    lake, _ = quick_run
    shutil.copytree(lake.root, tmp_path / "lake")
    copy = Lake(tmp_path / "lake", create=False)
    DeltaTable(str(tmp_path / "lake" / CHECKPOINTS)).delete("model_kind = 'agent' AND version = 1")
    newest = int(read_table(copy, CHECKPOINTS).filter(pl.col("model_kind") == "agent")["version"].max())
    client = create_app(copy).test_client()
    seen, queue, answers = set(), ["/", f"/checkpoints/agent/{newest}"], {}
    while queue and len(seen) < 400:
        url = queue.pop(0)
        if url in seen:
            continue
        seen.add(url)
        response = client.get(url)
        answers[url] = response.status_code
        if response.mimetype == "text/html":
            for link in re.findall(r'(?:href|src)="([^"#]+)"', response.get_data(as_text=True)):
                target = urljoin(url, link.replace("&amp;", "&"))
                if not urlsplit(target).netloc:
                    queue.append(target)
    assert len(seen) > 5 and {url: code for url, code in answers.items() if code != 200} == {}
    page = client.get(f"/checkpoints/agent/{newest}").get_data(as_text=True)
    assert "version 1 is not registered: the lineage stops here" in page


def test_kl_terms_are_held_near_the_warm_start_recorded_in_each_lineage(quick_run):
    """Every update after a warm start records that warm start as the reference of its KL term (GRPO's beta is on in
    the quick run), so its child finds it in one read; the warm start itself is held near the base model."""
    from trainers import manifest

    lake, _ = quick_run
    registered = read_table(lake, CHECKPOINTS).filter(pl.col("run_id") == run_of(lake))
    for row in registered.sort("version").iter_rows(named=True):
        lineage = manifest(lake, row["model_kind"], row["version"])
        parent = manifest(lake, row["model_kind"], row["parent_version"]) if row["parent_version"] else None
        if parent is None:
            assert lineage["reference_version"] == 0
        elif parent["metrics"]["warm_start"]:
            assert lineage["reference_version"] == row["parent_version"]
        else:
            assert lineage["reference_version"] == parent["reference_version"] > 0
