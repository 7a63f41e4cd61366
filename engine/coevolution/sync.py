"""The co-evolution loop in sync mode: the paper's epoch, the roles called in order, every event through Kafka and
the lake.

    prepare:        record the run's config in the lake, load each role's model
    warm start:     seed tasks + reference answers -> lake -> SFT of both models (optional)
    each epoch e:
      1. tasks:     Simulator.tasks_for (the mode decides which simulator, or the seeds)
      2. rollouts:  Rollouts.roll_out: group_size answers to every valid task
      3. rewards:   Scorer.reward on each rollout, Scorer.groups on each batch (p_hat, R_env, weight, filtered)
      4. publish everything, ingest until the lake holds it
      5. train:     Updater("agent"): GRPO on gold/d_train@v; Updater("env"): RWR on gold/d_env@v (mode genenv
                    only, and not after the last epoch: no epoch would write tasks with that simulator)
      6. publish the checkpoints, ingest them into registry/checkpoints
      7. validate:  the agent, greedy, on a fixed subset of the domain's held-out set (the whole set before
                    training and after the last epoch: the run's gain is after minus before on the same items)

Modes (equal agent-rollout budget: tasks_per_epoch x group_size per epoch in every mode):
    genenv          the simulator writes each epoch's tasks and is trained with RWR
    genenv-random   the simulator writes each epoch's tasks and is never trained
    genenv-static   the simulator writes every epoch's tasks once, before training; never trained
    seeds-only      the tasks are the domain's seed tasks; no simulator

Nothing is kept in memory between steps that the lake does not also hold: the trainers read the pools at
the version the ingest just produced, and the models are reloaded from their checkpoints. The async mode
(engine/workers) runs the same roles, one per process, connected only by Kafka and the lake.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import random
import statistics
import time
import uuid
from dataclasses import dataclass, field, replace

import polars as pl

from lake import Lake, RunRows
from streams import RewardScored, RolloutCompleted, event_of
from trainers import RWRConfig, TrainError, registry, release_free_heap
from trainers.update import SEED_VERSION

from ..domains import Task, get_domain, multi_turn
from .config import RunConfig, record_run_config
from .curriculum import in_band_share
from .memory import PhasePeaks, peak_rss_gb
from .progress import Phase, Say, no_phase
from .roles import (
    AGENTS_OWN,
    GUIDANCE,
    GeneratedTask,
    Rollouts,
    Scorer,
    Simulator,
    Updater,
    Validation,
    generated_task,
    run_version,
)
from .stats import interval, paired_gain
from .writer import LakeWriter


@dataclass
class EpochMetrics:
    epoch: int
    agent_version: int
    env_version: int
    tasks: int
    valid_share: float
    agent_success: float  # mean success over the epoch's rollouts on simulator tasks
    batch_p_hats: list[float]
    in_band_share: float
    difficulty: dict[str, float]
    response_tokens: float
    validation_accuracy: float
    validation_items: int = 0  # how many held-out items validation_accuracy is over (the subset, or the whole set)
    agent_optimizer_steps: int = 0  # the run's agent optimiser steps up to the end of this epoch
    seconds: dict[str, float] = field(default_factory=dict)
    peak_rss_gb: dict[str, float] = field(default_factory=dict)  # each phase's own peak RSS (memory.PhasePeaks)
    updates: dict[str, str] = field(default_factory=dict)  # what each trainer did (or why it skipped)
    # Whether the curriculum bites, from the lake's rows (engine/lineage/measures.py fills them after the epoch lands).
    selection_bias: float = float("nan")  # chosen level - mean offered level, over valid tasks
    chosen_levels: dict[str, int] = field(default_factory=dict)
    offered_levels: dict[str, int] = field(default_factory=dict)
    informative_groups_per_100: float = float("nan")  # groups with 0 < p_hat < 1 per 100 rollouts
    success_by_level: dict[str, float] = field(default_factory=dict)
    validation_by_level: dict[str, float] = field(default_factory=dict)  # held-out greedy success per level
    refilled_tasks: int = 0  # valid tasks written in place of groups whose rollouts all agreed (dynamic sampling)
    validation_successes: tuple[bool, ...] = ()  # item by item (the sync loop knows them; the lake keeps the rates)


def new_run_id(config: RunConfig) -> str:
    return config.run_id or f"{config.domain}-{config.mode}-s{config.seed}-{uuid.uuid4().hex[:6]}"


class CoEvolution:
    """One run of the sync loop. The constructor only wires the roles; `prepare()` (which `run()` calls) records
    the config and loads the models. start_from: (agent, env) checkpoint versions to begin with instead of the
    base models (the ablation's runs share one warm start)."""

    def __init__(
        self,
        config: RunConfig,
        lake: Lake,
        writer: LakeWriter | None = None,
        say: Say = print,
        run_id: str | None = None,
        phase: Phase | None = None,
        start_from: tuple[int, int] = (0, 0),
    ):
        self.config, self.lake, self.writer, self.say = config, lake, writer, say
        self.phase = phase or no_phase
        self.run_id = run_id or new_run_id(config)
        self.domain = get_domain(config.domain, config.seeds_path)
        self.simulator = Simulator(config, self.domain, self.run_id)
        self.rollouts = Rollouts(config, self.domain, self.run_id)
        self.scorer = Scorer(config, self.domain, self.run_id)
        self.updaters = {kind: Updater(kind, config, self.run_id) for kind in ("agent", "env")}
        self.start_from = start_from
        self.history: list[tuple[dict, bool]] = []  # (difficulty, success) of the last epoch, for the simulator
        self.metrics: list[EpochMetrics] = []
        self.initial_validation = Validation(float("nan"))
        self.warm_started = start_from  # (agent, env) versions after the warm start
        self.validated = Validation(float("nan"))  # the newest agent checkpoint's validation
        self.final_validation = Validation(float("nan"))  # the whole set after the last epoch
        self.agent_steps = 0  # agent optimiser steps of this run's updates (the warm start's not counted)
        self.phases: dict[str, dict[str, float]] = {}  # the run's steps outside the epochs: seconds and peak RSS
        self.landed: dict[int, list[GeneratedTask]] = {}  # a resumed run's epochs whose tasks the lake holds
        self.final_benchmark: dict = {}  # the end-of-run BFCL subset's metrics (config.final_bfcl_items)
        self.peaks = PhasePeaks()  # each phase's peak RSS, sampled while `run` or `resume` runs

    @functools.cached_property
    def validation(self) -> list[Task]:
        return self.domain.validation_set(self.config.validation_size)

    # -- the run ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Record the run's config in the lake (for replay and audit) and load each role's model."""
        record_run_config(self.lake, self.run_id, replace(self.config, run_id=self.run_id))
        self.load(*self.start_from)

    def run(self) -> list[EpochMetrics]:
        with self.peaks:
            return self._run()

    def _run(self) -> list[EpochMetrics]:
        with self.timed("prepare"):
            self.prepare()
        if self.config.warm_start:
            with self.timed("warm_start"):
                self.warm_start()
        if math.isnan(self.initial_accuracy):  # the ablation gives the later modes of a seed their shared start's
            with self.timed("validation_before"):
                self.initial_validation = self.validate()
        self.say(f"validation accuracy before training: {self.initial_accuracy:.3f}")
        for epoch in range(self.config.epochs):
            self.metrics.append(self.epoch(epoch))
        self.finish()
        return self.metrics

    def finish(self) -> None:
        """After the last epoch: the whole validation set (unless the last update was validated on it), and the
        BFCL subset when asked for."""
        with self.timed("validation_after"):
            whole = len(self.validated.successes) == len(self.validation)
            self.final_validation = self.validated if whole else self.validate()
        self.say(
            f"validation accuracy after training: {self.final_validation.accuracy:.3f} "
            f"(before: {self.initial_accuracy:.3f}, {len(self.validation)} items)"
        )
        if self.config.final_bfcl_items:
            with self.timed("final_benchmark"):
                self.final_benchmark = self.benchmark()

    @contextlib.contextmanager
    def timed(self, name: str):
        start = time.perf_counter()
        yield
        release_free_heap()
        self.phases[name] = {"seconds": round(time.perf_counter() - start, 2), "peak_rss_gb": self.peaks.take()}

    def learning(self) -> dict:
        """What the run taught, for metrics.json: the agent's optimiser steps, the whole held-out set before and
        after (same items) with the paired 95% interval of the gain, the curve of validation against steps (each
        point with its items' interval), and the time and peak RSS of each step of the run."""
        before, after = self.initial_validation, self.final_validation
        paired = (
            paired_gain(list(before.successes), list(after.successes)) if before.successes and after.successes else {}
        )
        curve = [
            {
                "agent_optimizer_steps": 0,
                "items": len(before.successes),
                "accuracy": before.accuracy,
                **_bounds(before.successes),
            }
        ]
        subset = [m.validation_items for m in self.metrics if m.validation_items != len(before.successes)]
        if subset and before.successes:  # the subset's items before training, for the subset's curve to start from
            first = before.successes[: subset[0]]
            curve.append(
                {
                    "agent_optimizer_steps": 0,
                    "items": len(first),
                    "accuracy": round(sum(first) / len(first), 4),
                    **_bounds(first),
                }
            )
        curve += [
            {
                "agent_optimizer_steps": m.agent_optimizer_steps,
                "items": m.validation_items,
                "accuracy": m.validation_accuracy,
                "epoch": m.epoch,
                **_bounds(m.validation_successes),
            }
            for m in self.metrics
            if m.validation_successes
        ]
        if after.successes and after is not self.validated:  # measured after the last epoch's own validation
            curve.append(
                {
                    "agent_optimizer_steps": self.agent_steps,
                    "items": len(after.successes),
                    "accuracy": after.accuracy,
                    **_bounds(after.successes),
                }
            )
        return {
            "agent_optimizer_steps": self.agent_steps,
            "validation_before": before.accuracy,
            "validation_after": after.accuracy,
            "validation_gain": paired.get("mean"),
            "validation_gain_interval": [paired.get("low"), paired.get("high")],
            "validation_items": len(after.successes),
            "learning_curve": curve,
            "phases": {
                **self.phases,
                **{
                    f"epoch_{m.epoch}": {
                        "seconds": round(sum(m.seconds.values()), 2),
                        "peak_rss_gb": max(m.peak_rss_gb.values(), default=0.0),
                    }
                    for m in self.metrics
                },
            },
            "peak_rss_gb": peak_rss_gb(),
        }

    def validation_answers(self) -> list[dict]:
        """The whole held-out set's greedy answers before training and after the last epoch, item by item, with
        the checker's verdicts: what the gain counts, for the report's validation.jsonl. [] where either was not
        made in this process (a resumed run's first validation was made before it)."""
        before, after = self.initial_validation, self.final_validation
        if not (before.answers and after.answers):
            return []
        feature = getattr(self.domain, "difficulty_feature", "")
        return [
            {
                "item": i,
                "level": task.difficulty.get(feature),
                "prompt": self.domain.agent_prompt(task),
                "before": {"answer": before.answers[i], "success": before.successes[i], "detail": before.details[i]},
                "after": {"answer": after.answers[i], "success": after.successes[i], "detail": after.details[i]},
            }
            for i, task in enumerate(self.validation)
        ]

    def resume(self) -> list[EpochMetrics]:
        """Continue this run (its run id) from what its lake holds, after the process or its broker died.

        An epoch whose every valid task is scored is done. If the last done epoch's updates are missing (the run
        died while training), they are made now. The epochs after it run as usual, except that an epoch whose
        tasks already landed takes them from the lake rather than writing new ones under the same ids; its
        rollouts and scores are made again, and where some had landed the lake keeps those (same ids). Returns the
        metrics of the epochs run here (the report reads every epoch's from the lake)."""
        with self.peaks:
            return self._resume()

    def _resume(self) -> list[EpochMetrics]:
        cfg = self.config
        if cfg.warm_start and run_version(self.lake, "agent", self.run_id) == 0:  # it died before its warm start was in
            self.load(0, 0)
            self.warm_start()
        tasks, done = landed_epochs(self.lake, self.run_id)
        self.rollouts.load(self.lake, run_version(self.lake, "agent", self.run_id, first=True))
        self.initial_validation = self.validate()
        self.load(run_version(self.lake, "agent", self.run_id), run_version(self.lake, "env", self.run_id))
        last = max(done, default=-1)
        if last >= 0:
            trained = {
                kind: {
                    row["epoch"]
                    for row in registry(self.lake, kind).filter(pl.col("run_id") == self.run_id).iter_rows(named=True)
                    if not json.loads(row["metrics_json"]).get("warm_start")
                }
                for kind in ("agent", "env")
            }
            updates: dict[str, str] = {}
            agent = self.train("agent", epoch=last, note=updates) if last not in trained["agent"] else None
            env = (
                self.train("env", epoch=last, note=updates)
                if self.trains_env(last) and last not in trained["env"]
                else None
            )
            self.load(agent or self.rollouts.version, env or self.simulator.version)
            self.history = [
                (tasks[last][r["task_id"]].parsed.difficulty, r["success"])
                for r in landed_rewards(self.lake, self.run_id, last)
                if r["task_id"] in tasks[last]
            ]
        self.say(
            f"resuming run {self.run_id} after epoch {last}: "
            f"agent v{self.rollouts.version}, env v{self.simulator.version}"
        )
        self.landed = {epoch: list(by_id.values()) for epoch, by_id in tasks.items() if epoch > last}
        for epoch in range(last + 1, cfg.epochs):
            self.metrics.append(self.epoch(epoch))
        self.finish()
        return self.metrics

    @property
    def initial_accuracy(self) -> float:
        return self.initial_validation.accuracy

    def validate(self, whole: bool = True) -> Validation:
        """The agent as it is now on the held-out set, or on its fixed subset (config.validation_subset)."""
        n = self.config.validation_subset
        tasks = self.validation if whole or not n else self.validation[:n]
        with self.phase(f"validation ({len(tasks)} items)") as tick:
            return self.rollouts.validate(tasks, progress=tick)

    def benchmark(self) -> dict:
        """The agent as it is now on the first final_bfcl_items items of each of BFCL's FINAL_CATEGORIES, greedy
        and batched, scored as `genenv eval` scores them and recorded in the lake's eval tables. Its metrics, with
        the eval id and the model version."""
        from ..benchmarks import ModelAgent, evaluate, record
        from ..benchmarks.bfcl import BFCL, FINAL_CATEGORIES

        bench, n = BFCL(FINAL_CATEGORIES), self.config.final_bfcl_items
        items = bench.load(None, n)
        agent = ModelAgent(self.rollouts.model, f"agent:v{self.rollouts.version}", self.config.generation_batch_size)
        with self.phase(f"BFCL after training: {len(items)} items") as tick:
            report = evaluate("bfcl", agent, f"agent:v{self.rollouts.version}", None, n, tick, bench, items)
        record(self.lake, report)
        self.say(
            f"BFCL ({', '.join(FINAL_CATEGORIES)}, {len(items)} items) after training: "
            + ", ".join(f"{k} {v:.3f}" for k, v in report.metrics.items() if isinstance(v, float))
        )
        return {
            "eval_id": report.eval_id,
            "model_version": report.model_version,
            "items": len(items),
            "categories": list(FINAL_CATEGORIES),
            **report.metrics,
        }

    def warm_start(self) -> None:
        """SFT of the agent on the seed tasks' reference answers and of the simulator on the seed task texts."""
        cfg = self.config
        start = time.perf_counter()
        seeds = self.domain.seeds(random.Random(cfg.seed + 7919), cfg.warm_start_tasks)
        batch_id = f"{self.run_id}-seed"
        agent_tok = self.rollouts.model.tokenizer
        sim_tok = (self.simulator.model or self.rollouts.model).tokenizer
        events, tasks = [], []
        for i, (request, text, task) in enumerate(seeds):
            task_id = f"{batch_id}-t{i}"
            seed_task = GeneratedTask(
                task_id, batch_id, self.simulator.prompt(request.prompt, sim_tok), text, task, SEED_VERSION, 0
            )
            tasks.append(seed_task)
            events.append(self.simulator.event(seed_task, producer="warm-start"))
            answer = self.domain.reference_answer(task)
            # a multi-turn answer: each command the answer of its own turn's prompt
            turns = self.rollouts.reference_turns(task) if multi_turn(self.domain) else []
            if turns:
                ids = [i for t in turns for i in t["token_ids"]]
            else:
                ids = agent_tok(answer, add_special_tokens=False)["input_ids"] + [agent_tok.eos_token_id]
            rollout_id = f"{task_id}-ref"
            events.append(
                RolloutCompleted(
                    run_id=self.run_id,
                    epoch=0,
                    rollout_id=rollout_id,
                    task_id=task_id,
                    group_index=0,
                    agent_model_version=SEED_VERSION,
                    prompt=self.rollouts.prompt(task),
                    completion=answer,
                    completion_token_ids=ids,
                    behaviour_logprobs=[0.0] * len(ids),
                    turns_json=json.dumps(turns),
                    producer="warm-start",
                )
            )
            events.append(
                RewardScored(
                    run_id=self.run_id,
                    epoch=0,
                    rollout_id=rollout_id,
                    task_id=task_id,
                    reward=1.0,
                    success=True,
                    checker_detail="reference answer (warm start)",
                    producer="warm-start",
                )
            )
        events += self.scorer.seeds(tasks)
        self.writer.publish(events)
        self.writer.land()
        # Steps, micro-batches and activation checkpointing as the simulator's RWR updates take them ([env]; by
        # default steps of 8 rows in micro-batches of 2, activations recomputed in the backward pass), for both
        # models: a warm start's rows are whole prompts and answers, as RWR's are (GRPO's rows share their prompt).
        # A seed's long simulator prompt made a micro-batch's activations the largest thing in the process, about
        # 4 GB at 8 rows for a 135M model; the agent's SFT, with them kept, was the run's peak (4.34 GB in the
        # process against 3.59 recomputed, docs/RESULTS.md "Time and memory"). The quick profile's tiny models take
        # all 8 at once.
        sft = RWRConfig(
            learning_rate=cfg.warm_start_learning_rate,
            per_device_train_batch_size=cfg.env.per_device_train_batch_size,
            gradient_accumulation_steps=cfg.env.gradient_accumulation_steps,
            kl_coef=0.0,
            num_train_epochs=cfg.warm_start_epochs,
            seed=cfg.seed,
            gradient_checkpointing=cfg.env.gradient_checkpointing,
        )
        agent = self.train("agent", epoch=0, options=sft, warm_start=True)
        env = self.train("env", epoch=0, options=sft, warm_start=True) if self.simulator.needs_model else None
        self.load(agent or self.rollouts.version, env or self.simulator.version)
        self.warm_started = (self.rollouts.version, self.simulator.version)
        self.say(
            f"warm start: {len(seeds)} seed tasks, agent v{self.rollouts.version}, env v{self.simulator.version} "
            f"({time.perf_counter() - start:.0f}s)"
        )

    def trains_env(self, epoch: int) -> bool:
        """Whether the simulator is trained after this epoch: in genenv mode, after every epoch but the last, whose
        update no epoch would write tasks with (its rows stay in the pool for a run that continues the lineage)."""
        return self.config.mode == "genenv" and epoch != self.config.epochs - 1

    def load(self, agent_version: int, env_version: int) -> None:
        """Each role's model at the given version (one already loaded at that version is kept)."""
        self.rollouts.load(self.lake, agent_version)
        if self.simulator.needs_model:
            self.simulator.load(self.lake, env_version)
        else:
            self.simulator.version = env_version

    def epoch(self, epoch: int) -> EpochMetrics:
        cfg = self.config
        seconds: dict[str, float] = {}
        clock = time.perf_counter()

        rss: dict[str, float] = {}

        def lap(phase: str) -> None:  # the time since the last lap added to `phase`, and its peak RSS
            nonlocal clock
            release_free_heap()
            now = time.perf_counter()
            seconds[phase] = round(seconds.get(phase, 0.0) + now - clock, 2)
            rss[phase] = max(rss.get(phase, 0.0), self.peaks.take())
            clock = now

        if epoch in self.landed:  # a resumed run's epoch whose tasks are in the lake already
            published, valid = [], self.landed[epoch]
        else:
            published, valid = self.simulator.tasks_for(epoch, self.history, progress_for=self.phase)
        lap("tasks")
        rollouts, rewards = self.attempt(valid, epoch, "")
        lap("rollouts")
        # Dynamic sampling (DAPO; verl's filter_groups): a group whose rollouts all agree has no GRPO advantage, so
        # up to refill_rounds rounds of new tasks take the place of those groups before the update.
        refills = 0
        for round_ in range(1, cfg.refill_rounds + 1):
            short = refill_shortfall(rewards, cfg.tasks_per_epoch, cfg.agent.max_groups)
            if short <= 0 or epoch in self.landed:
                break
            more, more_valid = self.simulator.refill(
                epoch, short, round_, len(published), len(valid), self.history, progress_for=self.phase
            )
            lap("tasks")
            published, valid = published + more, valid + more_valid
            extra = self.attempt(more_valid, epoch, f" (refill {round_})")
            rollouts, rewards, refills = rollouts + extra[0], rewards + extra[1], refills + len(more_valid)
            lap("rollouts")
        events = [self.simulator.event(t) for t in published]
        by_id = {t.task_id: t for t in valid}
        successes: dict[str, list[bool]] = {}
        for reward in rewards:
            successes.setdefault(reward.task_id, []).append(reward.success)
        scores = self.scorer.groups(valid, successes, epoch)
        events += [e for pair in zip(rollouts, rewards) for e in pair] + scores
        if cfg.guidance:  # after the scores, which are of the agent's own rollouts; a resumed epoch's, the same again
            failed = [t for t in valid if not any(successes[t.task_id])][: cfg.guidance]
            for guide in self.rollouts.guidance(failed, epoch):
                events += [guide, self.scorer.reward(by_id[guide.task_id], guide, producer=GUIDANCE)]
        lap("scoring")
        with self.phase(f"epoch {epoch}: {len(events)} events through Kafka into the lake"):
            self.writer.publish(events)
            self.writer.land()
        lap("ingest")

        updates: dict[str, str] = {}
        agent_version = self.train("agent", epoch=epoch, note=updates, lap=lap)
        lap("train_agent")
        env_version = None
        if self.trains_env(epoch):
            env_version = self.train("env", epoch=epoch, note=updates)
        elif cfg.mode == "genenv":
            updates["env"] = "skipped: the last epoch (no later epoch writes tasks with it; its rows stay in the pool)"
        lap("train_env")
        self.load(agent_version or self.rollouts.version, env_version or self.simulator.version)
        # The agent checkpoint's metrics carry its validation accuracy (so the lake alone tells it). An epoch
        # without an agent update keeps the unchanged agent's validation (greedy, so the same again) unless it has
        # none yet or the last epoch needs the whole set where it has the subset's.
        last = epoch == cfg.epochs - 1
        if not agent_version and (
            not self.validated.successes or (last and len(self.validated.successes) < len(self.validation))
        ):
            self.validated = self.validate(whole=last)
        validation = self.validated
        lap("validate")
        self.history = [(by_id[r.task_id].parsed.difficulty, r.success) for r in rewards]

        features = [t.parsed.difficulty for t in valid]
        difficulty = {k: round(statistics.fmean(f[k] for f in features), 3) for k in (features[0] if features else {})}
        metrics = EpochMetrics(
            epoch=epoch,
            agent_version=self.rollouts.version,
            env_version=self.simulator.version,
            tasks=len(published),
            valid_share=round(sum(isinstance(t.parsed, Task) for t in published) / len(published), 3)
            if published
            else float("nan"),
            agent_success=round(statistics.fmean(r.success for r in rewards), 3) if rewards else 0.0,
            batch_p_hats=[round(s.p_hat, 3) for s in scores],
            in_band_share=round(in_band_share(scores), 3),
            difficulty=difficulty,
            response_tokens=round(statistics.fmean(len(r.completion_token_ids) for r in rollouts), 2)
            if rollouts
            else 0.0,
            validation_accuracy=round(validation.accuracy, 3),
            validation_by_level=validation.by_level,
            validation_items=len(validation.successes),
            agent_optimizer_steps=self.agent_steps,
            seconds=seconds,
            peak_rss_gb=rss,
            updates=updates,
            validation_successes=validation.successes,
            refilled_tasks=refills,
        )
        self.say(
            f"epoch {epoch}: valid {metrics.valid_share:.0%}, agent success {metrics.agent_success:.2f}, "
            f"in band {metrics.in_band_share:.0%}, validation {metrics.validation_accuracy:.3f}, "
            f"agent v{self.rollouts.version}, env v{self.simulator.version}"
        )
        return metrics

    def attempt(
        self, tasks: list[GeneratedTask], epoch: int, what: str
    ) -> tuple[list[RolloutCompleted], list[RewardScored]]:
        """The agent's group_size rollouts of each task, and their rewards."""
        with self.phase(f"epoch {epoch}: rollouts{what}") as tick:
            rollouts = self.rollouts.roll_out(tasks, epoch, progress=tick)
        by_id = {t.task_id: t for t in tasks}
        return rollouts, [self.scorer.reward(by_id[r.task_id], r) for r in rollouts]

    def train(
        self,
        kind: str,
        *,
        epoch: int,
        options=None,
        warm_start: bool = False,
        note: dict | None = None,
        lap=lambda phase: release_free_heap(),
    ) -> int | None:
        """Train, publish the checkpoint, return its version; None (and why, in `note`) when there was nothing to
        train on. lap(phase): the epoch's clock, told when the update and the new agent's validation end (by default
        only the freed heap given back, as every lap does)."""
        role = self.rollouts if kind == "agent" else self.simulator
        parent = role.version
        # The trainer loads its own fp32 copy of the parent, and no role generates while it trains: both roles' copies
        # would only add to the peak memory (the idle one 0.54 GB of a 135M model in fp32, docs/RESULTS.md "Time and
        # memory"), and each is loaded again where it is next used (the epoch's end, `load`), a few seconds each.
        self.rollouts.unload()
        self.simulator.unload()
        what = f"{'warm start' if warm_start else f'epoch {epoch}'}: training {kind}"
        try:
            with self.phase(what) as tick:
                record = self.updaters[kind].update(
                    self.lake, parent, options=options, warm_start=warm_start, progress=tick
                )
        except TrainError as exc:
            if note is not None:
                note[kind] = f"skipped: {exc}"
            return None
        lap(f"train_{kind}")
        if kind == "agent" and not warm_start:
            self.agent_steps += record.metrics.get("optimizer_steps", 0)
            self.rollouts.load(self.lake, record.version, record.sha256)
            self.validated = self.validate(whole=epoch == self.config.epochs - 1)
            lap("validate")
            record.metrics["validation_accuracy"] = self.validated.accuracy
            record.metrics["validation_by_level"] = self.validated.by_level
            record.metrics["validation_items"] = len(self.validated.successes)
        self.writer.publish([self.updaters[kind].event(record, epoch)])
        self.writer.land()
        if note is not None:
            ess = record.metrics.get("effective_sample_size")  # RWR's: how many rows its weights spread over
            note[kind] = f"v{record.version} on {record.metrics['rows']} rows" + (f" (ESS {ess:.1f})" if ess else "")
        return record.version


def informative_groups(rewards: list[RewardScored]) -> int:
    """Tasks whose rollouts' rewards differ: the groups with a non-zero GRPO advantage."""
    by_task: dict[str, set[float]] = {}
    for r in rewards:
        by_task.setdefault(r.task_id, set()).add(r.reward)
    return sum(len(values) > 1 for values in by_task.values())


def refill_shortfall(rewards: list[RewardScored], tasks_per_epoch: int, max_groups: int) -> int:
    """How many more mixed groups dynamic sampling should write tasks for: the update trains at most max_groups
    of them (0: every one), so once that many are mixed a refill would only add rollouts nobody trains on."""
    wanted = min(tasks_per_epoch, max_groups) if max_groups else tasks_per_epoch
    return max(0, wanted - informative_groups(rewards))


def _bounds(successes) -> dict:
    """The 95% bootstrap interval of a validation's accuracy over its items."""
    ci = interval([float(s) for s in successes])
    return {"low": ci["low"], "high": ci["high"]}


def landed_epochs(lake: Lake, run_id: str) -> tuple[dict[int, dict[str, GeneratedTask]], set[int]]:
    """A run's valid tasks in the lake by epoch (task id -> task, in generation order; every epoch with any task,
    valid or not), and the epochs whose every valid task is scored (an epoch of invalid tasks only is done)."""
    run = RunRows(lake, run_id)
    scored = set(run.scored_ids().collect()["task_id"].to_list())
    index = pl.col("task_id").str.extract(r"-t(\d+)$").cast(pl.Int64)
    tasks: dict[int, dict[str, GeneratedTask]] = {}
    for row in run.tasks(valid=False).sort(["epoch", index]).collect().iter_rows(named=True):
        by_id = tasks.setdefault(row["epoch"], {})
        if row["valid"]:
            by_id[row["task_id"]] = generated_task(event_of("task", row))
    done = {epoch for epoch, by_id in tasks.items() if set(by_id) <= scored}
    return tasks, done


def landed_rewards(lake: Lake, run_id: str, epoch: int) -> list[dict]:
    """The rewards of the agent's own rollouts in one epoch of a run (guide rows left out: `RunConfig.guidance`)."""
    rewards = RunRows(lake, run_id).rewards().filter((pl.col("epoch") == epoch) & AGENTS_OWN)
    return rewards.sort("rollout_id").collect().to_dicts()
