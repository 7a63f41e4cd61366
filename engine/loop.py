"""The co-evolution loop in sync mode: the paper's epoch, every step through Kafka and the lake.

    warm start (optional): seed tasks + reference answers -> lake -> SFT of both models
    each epoch e:
      1. tasks:     the simulator writes tasks_per_epoch tasks (mode decides which simulator, or seeds)
      2. rollouts:  the agent answers every valid task group_size times; the domain's checker scores them
      3. batches:   the alpha-curriculum scores each batch (p_hat, R_env, weight, filtered)
      4. publish everything, ingest until the lake holds it
      5. train:     GRPO on gold/d_train@v (agent), RWR on gold/d_env@v (simulator, mode genenv only)
      6. publish the checkpoints, ingest them into registry/checkpoints
      7. validate:  the agent, greedy, on the domain's held-out set

Modes (equal agent-rollout budget: tasks_per_epoch x group_size per epoch in every mode):
    genenv          the simulator writes each epoch's tasks and is trained with RWR
    genenv-random   the simulator writes each epoch's tasks and is never trained
    genenv-static   the simulator writes every epoch's tasks once, before training; never trained
    seeds-only      the tasks are the domain's seed tasks; no simulator

Nothing is kept in memory between steps that the lake does not also hold: the trainers read the
pools at the version the ingest just produced, and the models are reloaded from their checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from lake import Lake
from streams import BatchScored, RewardScored, RolloutCompleted, TaskGenerated
from trainers import (
    RWRConfig, SamplingConfig, TrainError, TransformersBackend, VLLMBackend, load_checkpoint, load_published, render_prompt,
    train_update,
)
from trainers.update import SEED_VERSION

from .config import RunConfig, record_run_config
from .curriculum import score_groups
from .domains import Invalid, Task, get_domain, performance_summary, task_to_json
from .publishing import LakeWriter

Say = Callable[[str], None]
Tick = Callable[[int, int], None]  # (done, total)
Phase = Callable[[str], contextlib.AbstractContextManager[Tick]]  # one progress bar per phase


@contextlib.contextmanager
def _no_phase(description: str):
    yield lambda done, total: None
SIMULATOR_SYSTEM = "You write one task for a student. Reply with the task only."


@dataclass
class GeneratedTask:
    task_id: str
    batch_id: str
    sim_prompt: str
    generation: str
    parsed: Task | Invalid
    env_version: str
    epoch: int  # the epoch it was generated in


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
    seconds: dict[str, float] = field(default_factory=dict)
    updates: dict[str, str] = field(default_factory=dict)  # what each trainer did (or why it skipped)


class Engine:
    def __init__(self, config: RunConfig, lake: Lake, writer: LakeWriter | None = None, say: Say = print,
                 run_id: str | None = None, roles: tuple[str, ...] = ("agent", "env"), phase: Phase | None = None,
                 start_from: tuple[int, int] = (0, 0)):
        """start_from: (agent, env) checkpoint versions to begin with instead of the base models."""
        self.config = config
        self.phase = phase or _no_phase
        self.lake = lake
        self.writer = writer
        self.say = say
        self.domain = get_domain(config.domain, config.seeds_path)
        self.run_id = run_id or config.run_id or f"{config.domain}-{config.mode}-s{config.seed}-{uuid.uuid4().hex[:6]}"
        record_run_config(lake.root, self.run_id, replace(config, run_id=self.run_id))  # for replay and audit
        self.roles = roles if config.mode != "seeds-only" else tuple(r for r in roles if r != "env")
        self.rng = random.Random(config.seed)
        self.agent_version, self.env_version = start_from
        self.validation = self.domain.validation_set(config.validation_size)
        self.history: list[tuple[dict, bool]] = []  # (difficulty, success) of the last epoch, for the simulator
        self.static_tasks: list[GeneratedTask] = []
        self.metrics: list[EpochMetrics] = []
        self._loaded: dict[str, int] = {}  # the version each role's model in memory is at
        self._load_models()

    # -- models -----------------------------------------------------------------------------------
    def _load_models(self) -> None:
        """Each role's model at its current version; one already loaded at that version is kept (an epoch in which
        a trainer skipped, or the agent loaded for validation before its checkpoint was published)."""
        cfg = self.config
        for kind, attr, version, base in (("agent", "agent", self.agent_version, cfg.agent_model),
                                          ("env", "simulator", self.env_version, cfg.env_model)):
            if kind not in self.roles:
                setattr(self, attr, None)
            elif getattr(self, attr, None) is None or self._loaded.get(kind) != version:
                setattr(self, attr, load_checkpoint(self.lake, kind, version, base))
                self._loaded[kind] = version

    def _backend(self, loaded):
        if self.config.backend == "vllm":
            return VLLMBackend(loaded.source)
        return TransformersBackend(loaded.model, loaded.tokenizer, batch_size=self.config.generation_batch_size)

    def _sampling(self, max_new_tokens: int, salt: int, greedy: bool = False) -> SamplingConfig:
        return SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0 if greedy else self.config.temperature,
                              seed=self.config.seed * 1_000_003 + salt)

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> list[EpochMetrics]:
        cfg = self.config
        if cfg.warm_start:
            self.warm_start()
        self.initial_accuracy = self.validate()
        self.say(f"validation accuracy before training: {self.initial_accuracy:.3f}")
        for epoch in range(cfg.epochs):
            self.metrics.append(self.epoch(epoch))
        return self.metrics

    def warm_start(self) -> None:
        """SFT of the agent on the seed tasks' reference answers and of the simulator on the seed task texts."""
        cfg = self.config
        start = time.perf_counter()
        seeds = self.domain.seeds(random.Random(cfg.seed + 7919), cfg.warm_start_tasks)
        batch_id = f"{self.run_id}-seed"
        agent_tok = self.agent.tokenizer
        events = []
        for i, (request, text, task) in enumerate(seeds):
            task_id = f"{batch_id}-t{i}"
            sim_prompt = render_prompt((self.simulator or self.agent).tokenizer, request.prompt, system=SIMULATOR_SYSTEM)
            events.append(replace(self._task_event(GeneratedTask(task_id, batch_id, sim_prompt, text, task, SEED_VERSION, 0)),
                                  producer="warm-start"))
            answer = self.domain.reference_answer(task)
            ids = agent_tok(answer, add_special_tokens=False)["input_ids"] + [agent_tok.eos_token_id]
            rollout_id = f"{task_id}-ref"
            events.append(RolloutCompleted(
                run_id=self.run_id, epoch=0, rollout_id=rollout_id, task_id=task_id, group_index=0,
                agent_model_version=SEED_VERSION, prompt=self._agent_prompt(task), completion=answer,
                completion_token_ids=ids, behaviour_logprobs=[0.0] * len(ids), producer="warm-start"))
            events.append(RewardScored(run_id=self.run_id, epoch=0, rollout_id=rollout_id, task_id=task_id, reward=1.0,
                                       success=True, checker_detail="reference answer (warm start)", producer="warm-start"))
        scores = score_groups(batch_id, {f"{batch_id}-t{i}": [True] for i in range(len(seeds))}, cfg.curriculum)
        events += [self._batch_event(score, 0, producer="warm-start") for score in scores]
        self.writer.publish(events)
        self.writer.land()
        sft = RWRConfig(learning_rate=cfg.warm_start_learning_rate, per_device_train_batch_size=8, kl_coef=0.0,
                        num_train_epochs=cfg.warm_start_epochs, seed=cfg.seed)
        self.agent_version = self._update("agent", sft, warm_start=True, epoch=0) or self.agent_version
        if self.simulator is not None:
            self.env_version = self._update("env", sft, warm_start=True, epoch=0) or self.env_version
        self._load_models()
        self.warm_started = (self.agent_version, self.env_version)
        self.say(f"warm start: {len(seeds)} seed tasks, agent v{self.agent_version}, env v{self.env_version} "
                 f"({time.perf_counter() - start:.0f}s)")

    def epoch(self, epoch: int) -> EpochMetrics:
        cfg = self.config
        seconds: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(phase: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            seconds[phase] = round(now - clock, 2)
            clock = now

        published, valid = self.tasks_for(epoch)
        events = [self._task_event(t) for t in published]
        lap("tasks")
        rollout_events, successes, history, generations = self.roll_out(valid, epoch, salt=2 * epoch + 1)
        events += rollout_events
        lap("rollouts")
        scores = self.score(valid, successes)
        events += [self._batch_event(s, epoch) for s in scores]
        lap("scoring")
        with self.phase(f"epoch {epoch}: {len(events)} events through Kafka into the lake"):
            self.writer.publish(events)
            self.writer.land()
        lap("ingest")

        updates = {}
        agent_trained = self._update("agent", cfg.agent, epoch=epoch, note=updates)
        if agent_trained:
            self.agent_version = agent_trained
        lap("train_agent")
        if cfg.mode == "genenv":
            version = self._update("env", cfg.env, epoch=epoch, note=updates)
            if version:
                self.env_version = version
        lap("train_env")
        self._load_models()
        # The agent checkpoint's metrics carry its validation accuracy (so the lake alone tells it); an epoch
        # without an agent update validates the unchanged agent.
        accuracy = self.validated if agent_trained else self.validate()
        lap("validate")
        self.history = history

        features = [t.parsed.difficulty for t in valid]
        difficulty = {k: round(statistics.fmean(f[k] for f in features), 3) for k in (features[0] if features else {})}
        metrics = EpochMetrics(
            epoch=epoch, agent_version=self.agent_version, env_version=self.env_version, tasks=len(published),
            valid_share=round(sum(isinstance(t.parsed, Task) for t in published) / len(published), 3) if published else float("nan"),
            agent_success=round(statistics.fmean(s for _, s in history), 3) if history else 0.0,
            batch_p_hats=[round(s.p_hat, 3) for s in scores],
            in_band_share=round(statistics.fmean(not s.filtered for s in scores), 3) if scores else 0.0,
            difficulty=difficulty,
            response_tokens=round(statistics.fmean(len(g.token_ids) for g in generations), 2) if generations else 0.0,
            validation_accuracy=round(accuracy, 3), seconds=seconds, updates=updates,
        )
        self.say(f"epoch {epoch}: valid {metrics.valid_share:.0%}, agent success {metrics.agent_success:.2f}, "
                 f"in band {metrics.in_band_share:.0%}, validation {metrics.validation_accuracy:.3f}, "
                 f"agent v{self.agent_version}, env v{self.env_version}")
        return metrics

    # -- steps (the async workers run them one by one) ---------------------------------------------
    def roll_out(self, valid: list[GeneratedTask], epoch: int, salt: int, score: bool = True):
        """group_size rollouts of every valid task by the current agent, checked: (events, successes by task,
        (difficulty, success) pairs, generations). score=False: the rollouts only (a reward worker checks them)."""
        cfg = self.config
        prompts = [self._agent_prompt(t.parsed) for t in valid for _ in range(cfg.group_size)]
        with self.phase(f"epoch {epoch}: rollouts") as tick:
            generations = self._backend(self.agent).generate(
                prompts, self._sampling(cfg.agent_max_new_tokens, salt), progress=tick) if prompts else []
        events, successes, history = [], {}, []
        for i, generation in enumerate(generations):
            task = valid[i // cfg.group_size]
            rollout_id = f"{task.task_id}-r{i % cfg.group_size}"
            events.append(RolloutCompleted(
                run_id=self.run_id, epoch=epoch, rollout_id=rollout_id, task_id=task.task_id,
                group_index=i % cfg.group_size, agent_model_version=str(self.agent_version), prompt=generation.prompt,
                completion=generation.text, completion_token_ids=generation.token_ids,
                behaviour_logprobs=generation.logprobs, producer="rollout"))
            if not score:
                continue
            verdict = self.domain.check(task.parsed, generation.text)
            events.append(RewardScored(run_id=self.run_id, epoch=epoch, rollout_id=rollout_id, task_id=task.task_id,
                                       reward=verdict.reward, success=verdict.success, checker_detail=verdict.detail,
                                       producer="reward"))
            successes.setdefault(task.task_id, []).append(verdict.success)
            history.append((task.parsed.difficulty, verdict.success))
        return events, successes, history, generations

    def score(self, valid: list[GeneratedTask], successes: dict[str, list[bool]]):
        """The curriculum's scores of each batch (or task) of valid tasks."""
        by_batch: dict[str, dict[str, list[bool]]] = {}
        for t in valid:
            by_batch.setdefault(t.batch_id, {})[t.task_id] = successes.get(t.task_id, [])
        return [score for batch_id, members in by_batch.items()
                for score in score_groups(batch_id, members, self.config.curriculum)]

    def tasks_for(self, epoch: int) -> tuple[list[GeneratedTask], list[GeneratedTask]]:
        """(tasks to publish this epoch, valid tasks the agent attempts this epoch).

        Every mode gives the agent tasks_per_epoch valid tasks an epoch when it can (equal rollout budget): the
        simulator writes more until it has them, up to max_generation_attempts rounds, and every generation is
        published, parseable or not."""
        cfg = self.config
        n = cfg.tasks_per_epoch
        if cfg.mode == "seeds-only":
            tasks = [GeneratedTask(f"{self.run_id}-e{epoch}-t{i}", self.batch_id(epoch, i), "", text, task, SEED_VERSION, epoch)
                     for i, (_, text, task) in enumerate(self.domain.seeds(self.rng, n))]
            return tasks, tasks
        if cfg.mode == "genenv-static":
            published = []
            if epoch == 0:
                published = self.generate_tasks(0, n * cfg.epochs)
                self.static_tasks = [t for t in published if isinstance(t.parsed, Task)]
            return published, self.static_tasks[epoch * n:(epoch + 1) * n]
        tasks = self.generate_tasks(epoch, n)
        return tasks, [t for t in tasks if isinstance(t.parsed, Task)]

    def generate_tasks(self, epoch: int, n_valid: int) -> list[GeneratedTask]:
        """Simulator generations until n_valid parse (or the attempts run out); valid ones batched in order."""
        cfg = self.config
        summary = performance_summary(self.history, self.domain.difficulty_feature)
        tasks: list[GeneratedTask] = []
        valid = 0
        for attempt in range(cfg.max_generation_attempts):
            wanted = n_valid - valid
            if wanted <= 0:
                break
            requests = [self.domain.simulator_request(self.rng, summary) for _ in range(wanted)]
            prompts = [render_prompt(self.simulator.tokenizer, r.prompt, system=SIMULATOR_SYSTEM) for r in requests]
            with self.phase(f"epoch {epoch}: simulator writes {wanted} tasks (attempt {attempt + 1})") as tick:
                generations = self._backend(self.simulator).generate(
                    prompts, self._sampling(cfg.env_max_new_tokens, 1000 * epoch + attempt), progress=tick)
            for request, generation in zip(requests, generations):
                parsed = self.domain.parse(generation.text, request.context)
                batch_id = self.batch_id(epoch, valid) if isinstance(parsed, Task) else f"{self.run_id}-e{epoch}-invalid"
                valid += isinstance(parsed, Task)
                tasks.append(GeneratedTask(f"{self.run_id}-e{epoch}-t{len(tasks)}", batch_id, generation.prompt,
                                           generation.text, parsed, str(self.env_version), epoch))
        return tasks

    def batch_id(self, epoch: int, index: int) -> str:
        """Valid tasks are batched in the order they parse, batch_size to a batch."""
        return f"{self.run_id}-e{epoch}-b{index // self.config.batch_size}"

    def validate(self) -> float:
        prompts = [self._agent_prompt(t) for t in self.validation]
        with self.phase("validation") as tick:
            generations = self._backend(self.agent).generate(
                prompts, self._sampling(self.config.agent_max_new_tokens, 0, greedy=True), progress=tick)
        return statistics.fmean(self.domain.check(t, g.text).success for t, g in zip(self.validation, generations))

    def _update(self, kind: str, config, *, epoch: int, warm_start: bool = False, note: dict | None = None) -> int | None:
        """Train, publish the checkpoint, return its version; None (and why, in `note`) when there was nothing to train on."""
        base = self.config.agent_model if kind == "agent" else self.config.env_model
        parent = self.agent_version if kind == "agent" else self.env_version
        what = f"{'warm start' if warm_start else f'epoch {epoch}'}: training {kind}"
        try:
            with self.phase(what) as tick:
                record = train_update(kind, self.lake, config, base_model=base, parent_version=parent,
                                      run_id=self.run_id, warm_start=warm_start, progress=tick)
        except TrainError as exc:
            if note is not None:
                note[kind] = f"skipped: {exc}"
            return None
        if kind == "agent" and not warm_start:
            self.agent = load_published(self.lake, kind, record.version, record.sha256)
            self._loaded["agent"] = record.version
            self.validated = self.validate()
            record.metrics["validation_accuracy"] = round(self.validated, 4)
        self.writer.publish_checkpoint(record, self.run_id, epoch)
        if note is not None:
            note[kind] = f"v{record.version} on {record.metrics['rows']} rows"
        return record.version

    # -- events -----------------------------------------------------------------------------------
    def _agent_prompt(self, task: Task) -> str:
        return render_prompt(self.agent.tokenizer, self.domain.agent_prompt(task), system=self.domain.agent_system)

    def _task_event(self, t: GeneratedTask) -> TaskGenerated:
        common = dict(run_id=self.run_id, epoch=t.epoch, task_id=t.task_id, batch_id=t.batch_id, domain=self.domain.name,
                      env_model_version=t.env_version, sim_prompt=t.sim_prompt, raw_generation=t.generation,
                      producer="simulator")
        if isinstance(t.parsed, Invalid):
            return TaskGenerated(**common, valid=False, invalid_reason=t.parsed.reason)
        tools, reference, difficulty = task_to_json(t.parsed)
        return TaskGenerated(**common, task_prompt=t.parsed.prompt, tools_json=tools, reference_json=reference,
                             difficulty_json=difficulty)

    def _batch_event(self, score, epoch: int, producer: str = "reward", granularity: str | None = None) -> BatchScored:
        return BatchScored(
            run_id=self.run_id, epoch=epoch, batch_id=score.batch_id, task_ids=score.task_ids,
            granularity=granularity or self.config.curriculum.granularity, p_hat=score.p_hat, env_reward=score.env_reward,
            weight=score.weight, filtered=score.filtered, n_tasks=len(score.task_ids), n_rollouts=score.n_rollouts,
            n_success=score.n_success, producer=producer)


def metrics_json(metrics: list[EpochMetrics]) -> str:
    return json.dumps([m.__dict__ for m in metrics], indent=2)
