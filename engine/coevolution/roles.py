"""The co-evolution's roles: small components with explicit inputs and outputs, events in and events out.

    Simulator   simulator requests -> generations -> tasks                  TaskGenerated
    Rollouts    tasks -> group_size rollouts each, with behaviour logprobs  RolloutCompleted
    Scorer      rollouts -> rewards; complete groups -> curriculum scores   RewardScored, BatchScored
    Updater     a pool version -> a checkpoint                              CheckpointPublished

The sync loop (sync.py) calls them in order; each async worker (engine/workers) wraps one of them in a
Kafka consumer loop. A role's constructor takes configuration only: it loads no model, opens no connection
and reads no file. `load(lake, version)` is the step that reads weights; the events a role returns go out
through whoever holds a producer (the sync loop's LakeWriter, a worker's producer), never through the role.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace

import polars as pl
import torch

from lake import Lake
from streams import BatchScored, CheckpointPublished, RewardScored, RolloutCompleted, TaskGenerated
from trainers import (
    GUIDE_SUFFIX,
    CheckpointRecord,
    Precision,
    SamplingConfig,
    TransformersBackend,
    VLLMBackend,
    VLLMServerBackend,
    load_checkpoint,
    load_published,
    prompt_token_ids,
    registry,
    render_prompt,
    sample_seed,
    sequence_logprobs,
    train_update,
)
from trainers.update import SEED_VERSION

from ..domains import (
    Domain,
    Invalid,
    SimulatorRequest,
    Task,
    Verdict,
    multi_turn,
    performance_summary,
    task_from_row,
    task_to_json,
)
from .config import RunConfig
from .curriculum import score_groups
from .progress import Tick

SIMULATOR_SYSTEM = "You write one task for a student. Reply with the task only."
GUIDANCE = "guidance"  # the producer of guide rows (`Rollouts.guidance`) and of their rewards
# The rows of the agent's own rollouts (and their tasks and rewards): not the warm start's seeds and reference
# answers, not guide rows. What every reader of a run's success counts.
AGENTS_OWN = ~pl.col("producer").is_in(["warm-start", GUIDANCE])


@dataclass
class GeneratedTask:
    """A task as the roles pass it around: the simulator's text, what the domain parsed from it, where it came from."""

    task_id: str
    batch_id: str
    sim_prompt: str
    generation: str
    parsed: Task | Invalid
    env_version: str
    epoch: int  # the epoch it was generated in
    offered: list[float] = field(default_factory=list)  # the difficulty levels the simulator's request offered
    temperature: float | None = None  # what the simulator sampled it at (None: a seed task, not generated)


def task_of(event) -> Task | Invalid:
    """The task a TaskGenerated carries. Its JSON fields are a producer's text: one that does not parse makes the
    task invalid, never stops the worker (the ingestor keeps the event; docs/EVENTS.md)."""
    if not event.valid:
        return Invalid(event.invalid_reason or "")
    try:
        return task_from_row(event.to_dict())
    except (ValueError, RecursionError, TypeError, KeyError) as exc:
        return Invalid(f"unreadable task fields: {exc.__class__.__name__}")


def offered_of(raw: str) -> list[float]:
    """The offered levels a TaskGenerated carries (a producer's text: anything but a list of numbers reads as none)."""
    try:
        values = json.loads(raw)
    except (ValueError, RecursionError):
        return []
    ok = isinstance(values, list) and all(type(v) in (int, float) for v in values)
    return values if ok else []


def generated_task(event) -> GeneratedTask:
    return GeneratedTask(
        event.task_id,
        event.batch_id,
        event.sim_prompt,
        event.raw_generation,
        task_of(event),
        event.env_model_version,
        event.epoch,
        offered_of(event.offered_json),
    )


def run_version(lake: Lake, kind: str, run_id: str, first: bool = False) -> int:
    """The newest checkpoint of this run (first: its oldest, the warm start); 0 (the base model) when it has none."""
    rows = registry(lake, kind)
    rows = rows.filter(rows["run_id"] == run_id)
    if not rows.height:
        return 0
    return int(rows["version"].min() if first else rows["version"].max())


def level_name(value: float) -> str:
    """A difficulty level as the measures, validation and reports key it: '3', or '2.5'."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class Validation:
    """Greedy success on the domain's held-out set: overall, and per level of its difficulty feature (keys as
    engine/lineage/measures.py writes levels; empty when the tasks carry no such feature)."""

    accuracy: float
    by_level: dict[str, float] = field(default_factory=dict)
    successes: tuple[bool, ...] = ()  # item by item, in the set's order: what a paired gain compares
    answers: tuple[str, ...] = ()  # the greedy answers, item by item (the report's validation.jsonl)
    details: tuple[str, ...] = ()  # the checker's verdict on each


def _quiet(done: int, total: int) -> None:
    pass


def rollout_seed(run_seed: int, run_id: str, task_id: str, index: int) -> int:
    """The sampling seed of rollout `index` of a task: distinct within and across groups, fixed by the run's seed and
    the task's place in the run (its id less the run id), so that two runs of one config sample alike."""
    return sample_seed(run_seed, task_id.removeprefix(f"{run_id}-"), index)


@dataclass(frozen=True)
class Trajectory:
    """A multi-turn rollout as a RolloutCompleted carries it: the first turn's prompt, the commands one a line,
    every turn's reply tokens and log-probabilities end to end, and the turns themselves."""

    prompt: str
    text: str
    token_ids: list[int]
    logprobs: list[float]
    turns_json: str


def turn_record(prompt: str, reply: str, token_ids, logprobs, command: str, observation: str) -> dict:
    """One turn of a trajectory as turns_json holds it: the rendered prompt, the reply with its token ids and
    log-probabilities (what GRPO trains), the command it was taken as and what the agent then saw (what audit shows)."""
    return {
        "prompt": prompt,
        "completion": reply,
        "token_ids": list(token_ids),
        "logprobs": list(logprobs),
        "command": command,
        "observation": observation,
    }


def trajectory_generation(turns: list[dict]) -> Trajectory:
    return Trajectory(
        turns[0]["prompt"] if turns else "",
        "\n".join(t["command"] for t in turns),
        [i for t in turns for i in t["token_ids"]],
        [p for t in turns for p in t["logprobs"]],
        json.dumps(turns),
    )


class ModelRole:
    """A role that holds one model (kind agent or env) at one checkpoint version; nothing is loaded until `load`."""

    kind = ""

    def __init__(self, config: RunConfig, domain: Domain, run_id: str):
        self.config, self.domain, self.run_id = config, domain, run_id
        self.version = 0  # the checkpoint version the role works with (0: the base model)
        self.model = None  # trainers.LoadedModel once loaded
        self.engine = None  # the vLLM engine, built once per process on first use

    @property
    def base_model(self) -> str:
        return self.config.agent_model if self.kind == "agent" else self.config.env_model

    @property
    def temperature(self) -> float:
        """What the role samples at: the simulator at `simulator_temperature` where one is set."""
        cfg = self.config
        return cfg.simulator_sampling_temperature if self.kind == "env" else cfg.temperature

    def load(self, lake: Lake, version: int, sha256: str | None = None) -> None:
        """The model at `version` (0: the base model). With `sha256`, the checkpoint a CheckpointPublished event
        names (checked against that hash); without, the one the registry holds. A model already loaded at that
        version is kept."""
        if self.model is not None and version == self.version:
            return
        # With vLLM the weights that generate live in its engine: the transformers copy, only read to load them
        # into it, stays on the CPU.
        precision = (
            self.config.precision if self.config.backend == "transformers" else Precision("cpu", self.config.dtype)
        )
        self.model = (
            load_published(lake, self.kind, version, sha256, precision)
            if sha256
            else load_checkpoint(lake, self.kind, version, self.base_model, precision)
        )
        self.version = version
        if self.engine is not None:
            self.engine.load_weights(self.model.source)  # the same engine, the new checkpoint's (verified) files

    def unload(self) -> None:
        """Drop the model's transformers copy; a vLLM engine stays, to take the next checkpoint's weights."""
        self.model = None

    def release(self) -> None:
        """Drop the model and shut its vLLM engine down, giving its GPU memory back: for a process that is done
        with the role (dropping the reference alone left the engine's reservation beside every async worker's)."""
        self.unload()
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def generate(
        self,
        prompts: list[str],
        max_new_tokens: int,
        seeds: list[int] | None = None,
        greedy: bool = False,
        progress: Tick = _quiet,
        grammars: list[str] | None = None,
    ):
        """One generation per prompt; seeds: one per prompt (trainers.sample_seed), unused when greedy; grammars: one
        per prompt, the form its output is constrained to ("": free)."""
        if self.model is None:
            raise RuntimeError(f"{self.kind} model not loaded: call load() first")
        if not prompts:
            return []
        cfg = self.config
        # The agent's answers end where the domain says an answer ends (`agent_stop`), in rollouts and validation alike.
        stop = tuple(getattr(self.domain, "agent_stop", ())) if self.kind == "agent" else ()
        sampling = SamplingConfig(
            max_new_tokens=max_new_tokens, temperature=0.0 if greedy else self.temperature, seed=cfg.seed, stop=stop
        )
        return self.backend().generate(prompts, sampling, seeds=seeds, progress=progress, grammars=grammars)

    def backend(self):
        cfg = self.config
        if cfg.backend == "transformers":
            return TransformersBackend(self.model.model, self.model.tokenizer, batch_size=cfg.generation_batch_size)
        if self.engine is None and cfg.backend == "vllm-server":
            agent = self.kind == "agent"
            self.engine = VLLMServerBackend(
                cfg.agent_vllm_server_base_url if agent else cfg.env_vllm_server_base_url,
                self.model.tokenizer,
                device=cfg.precision.resolved().device,
                group_port=51216 if agent else 51217,  # one NCCL group per server this process talks to
            )
            self.engine.load_weights(self.model.source)  # the server started from the base model
        if self.engine is None:
            self.engine = VLLMBackend(
                self.model.source,
                cfg.tensor_parallel_size,
                cfg.gpu_memory_utilization,
                cfg.precision.resolved().dtype,
                cfg.seed,
                cfg.max_model_len or None,
            )
        return self.engine


class Simulator(ModelRole):
    """Requests -> generations -> tasks. The run's mode decides where an epoch's tasks come from:

    genenv, genenv-random   the simulator writes each epoch's tasks
    genenv-static           the simulator writes every epoch's tasks once, in epoch 0
    seeds-only              the domain's seed tasks; no simulator model
    """

    kind = "env"

    def __init__(self, config: RunConfig, domain: Domain, run_id: str):
        super().__init__(config, domain, run_id)
        self.rng = random.Random(config.seed)  # which requests, in which order: part of the run's seed
        self.static_tasks: list[GeneratedTask] = []

    @property
    def needs_model(self) -> bool:
        return self.config.mode != "seeds-only"

    def tasks_for(
        self, epoch: int, history: list[tuple[dict, bool]], progress_for=None
    ) -> tuple[list[GeneratedTask], list[GeneratedTask]]:
        """(tasks to publish this epoch, valid tasks the agent attempts this epoch). `history`: (difficulty, success)
        of recent rollouts, which the simulator's prompt summarises.

        Every mode gives the agent tasks_per_epoch valid tasks an epoch when it can (equal rollout budget): the
        simulator writes more until it has them, up to max_generation_attempts rounds, and every generation is
        published, parseable or not."""
        cfg = self.config
        n = cfg.tasks_per_epoch
        if cfg.mode == "seeds-only":
            tasks = [
                GeneratedTask(
                    f"{self.run_id}-e{epoch}-t{i}", self.batch_id(epoch, i), "", text, task, SEED_VERSION, epoch
                )
                for i, (_, text, task) in enumerate(self.domain.seeds(self.rng, n))
            ]
            return tasks, tasks
        if cfg.mode == "genenv-static":
            published = []
            if epoch == 0:
                published = self.write(0, n * cfg.epochs, history, progress_for)
                self.static_tasks = [t for t in published if isinstance(t.parsed, Task)]
            return published, self.static_tasks[epoch * n : (epoch + 1) * n]
        tasks = self.write(epoch, n, history, progress_for)
        return tasks, [t for t in tasks if isinstance(t.parsed, Task)]

    def write(
        self,
        epoch: int,
        n_valid: int,
        history: list[tuple[dict, bool]],
        progress_for=None,
        first: int = 0,
        first_valid: int = 0,
        round_: int = 0,
    ) -> list[GeneratedTask]:
        """Simulator generations until n_valid parse (or the attempts run out); valid ones batched in order.
        progress_for(description) -> a Phase context giving a Tick (one bar per attempt). first, first_valid: the
        epoch's tasks and valid tasks so far (task ids and batches go on from them); round_: the epoch's round of
        generation (0, then the refills of DAPO's dynamic sampling), which the sampling seeds depend on."""
        cfg = self.config
        summary = performance_summary(history, self.domain.difficulty_feature)
        tasks: list[GeneratedTask] = []
        valid = 0
        for attempt in range(cfg.max_generation_attempts):
            wanted = n_valid - valid
            if wanted <= 0:
                break
            requests = [self.request(summary, epoch, round_, attempt, i) for i in range(wanted)]
            prompts = [self.prompt(r.prompt) for r in requests]
            description = f"epoch {epoch}: simulator writes {wanted} tasks (attempt {attempt + 1})"
            key = (epoch, attempt) if round_ == 0 else (epoch, "refill", round_, attempt)
            seeds = [sample_seed(cfg.seed, "simulator", *key, i) for i in range(wanted)]  # not the run id: runs repeat
            grammars = [r.grammar for r in requests]
            if progress_for is None:
                generations = self.generate(prompts, cfg.env_max_new_tokens, seeds, grammars=grammars)
            else:
                with progress_for(description) as tick:
                    generations = self.generate(
                        prompts, cfg.env_max_new_tokens, seeds, progress=tick, grammars=grammars
                    )
            for request, generation in zip(requests, generations):
                parsed = self.domain.parse(generation.text, request.context)
                batch_id = (
                    self.batch_id(epoch, first_valid + valid)
                    if isinstance(parsed, Task)
                    else f"{self.run_id}-e{epoch}-invalid"
                )
                valid += isinstance(parsed, Task)
                tasks.append(
                    GeneratedTask(
                        f"{self.run_id}-e{epoch}-t{first + len(tasks)}",
                        batch_id,
                        generation.prompt,
                        generation.text,
                        parsed,
                        str(self.version),
                        epoch,
                        request.offered,
                        self.temperature,
                    )
                )
        return tasks

    def request(self, summary: str, *key) -> SimulatorRequest:
        """The domain's next request; in genenv mode, `simulator_explore` of them with the choice drawn uniformly
        (by a draw of its own, so the requests are the same whatever the share) and fixed by the grammar."""
        explore = self.config.simulator_explore if self.config.mode == "genenv" else 0.0
        if explore:
            draw = random.Random(sample_seed(self.config.seed, "explore", *key))
            if draw.random() < explore:
                return self.domain.simulator_request(self.rng, summary, choice=draw.randrange(self.domain.choices))
        return self.domain.simulator_request(self.rng, summary)

    def refill(
        self,
        epoch: int,
        n: int,
        round_: int,
        first: int,
        first_valid: int,
        history: list[tuple[dict, bool]],
        progress_for=None,
    ) -> tuple[list[GeneratedTask], list[GeneratedTask]]:
        """n more tasks for this epoch, in place of groups whose rollouts all agreed (dynamic sampling): as
        `tasks_for`, from the same source (seeds for seeds-only; the simulator as it is now otherwise, which for
        genenv-static is the untrained simulator that wrote its tasks)."""
        if self.config.mode == "seeds-only":
            tasks = [
                GeneratedTask(
                    f"{self.run_id}-e{epoch}-t{first + i}",
                    self.batch_id(epoch, first_valid + i),
                    "",
                    text,
                    task,
                    SEED_VERSION,
                    epoch,
                )
                for i, (_, text, task) in enumerate(self.domain.seeds(self.rng, n))
            ]
            return tasks, tasks
        tasks = self.write(epoch, n, history, progress_for, first, first_valid, round_)
        return tasks, [t for t in tasks if isinstance(t.parsed, Task)]

    def prompt(self, request: str, tokenizer=None) -> str:
        """A simulator request in the chat template of the simulator's tokenizer (or the one given)."""
        return render_prompt(tokenizer or self.model.tokenizer, request, system=SIMULATOR_SYSTEM)

    def batch_id(self, epoch: int, index: int) -> str:
        """Valid tasks are batched in the order they parse, batch_size to a batch."""
        return f"{self.run_id}-e{epoch}-b{index // self.config.batch_size}"

    def event(self, task: GeneratedTask, producer: str = "simulator") -> TaskGenerated:
        common = dict(
            run_id=self.run_id,
            epoch=task.epoch,
            task_id=task.task_id,
            batch_id=task.batch_id,
            domain=self.domain.name,
            env_model_version=task.env_version,
            sim_prompt=task.sim_prompt,
            raw_generation=task.generation,
            offered_json=json.dumps(task.offered),
            temperature=task.temperature,
            producer=producer,
        )
        if isinstance(task.parsed, Invalid):
            return TaskGenerated(**common, valid=False, invalid_reason=task.parsed.reason)
        tools, reference, difficulty = task_to_json(task.parsed)
        return TaskGenerated(
            **common,
            task_prompt=task.parsed.prompt,
            tools_json=tools,
            reference_json=reference,
            difficulty_json=difficulty,
        )


class Rollouts(ModelRole):
    """Tasks -> group_size rollouts each, by the agent at its current version, with behaviour logprobs; and the
    agent's greedy accuracy on a validation set."""

    kind = "agent"

    def prompt(self, task: Task) -> str:
        return render_prompt(self.model.tokenizer, self.domain.agent_prompt(task), system=self.domain.agent_system)

    def roll_out(
        self, tasks: list[GeneratedTask], epoch: int, progress: Tick = _quiet, producer: str = "rollout"
    ) -> list[RolloutCompleted]:
        """group_size rollouts of every task, in task order; rollout ids are `<task id>-r<i>`. Rollout i of a task is
        sampled with `rollout_seed(run seed, run id, task id, i)`: a group's rollouts differ, and a replay (or another
        run of the config) gets them again.
        In a multi-turn domain (one with `max_turns`) a rollout is a trajectory (`play`): its completion is its
        commands, one a line, and turns_json holds each turn's prompt, tokens and log-probabilities."""
        g = self.config.group_size
        seeds = [rollout_seed(self.config.seed, self.run_id, t.task_id, i) for t in tasks for i in range(g)]
        if multi_turn(self.domain):
            trajectories = self.play([t.parsed for t in tasks for _ in range(g)], seeds, progress)
            generations = [trajectory_generation(turns) for turns in trajectories]
        else:
            prompts = [self.prompt(t.parsed) for t in tasks for _ in range(g)]
            generations = self.generate(prompts, self.config.agent_max_new_tokens, seeds, progress=progress)
        return [
            RolloutCompleted(
                run_id=self.run_id,
                epoch=epoch,
                rollout_id=f"{tasks[i // g].task_id}-r{i % g}",
                task_id=tasks[i // g].task_id,
                group_index=i % g,
                agent_model_version=str(self.version),
                prompt=generation.prompt,
                completion=generation.text,
                completion_token_ids=generation.token_ids,
                behaviour_logprobs=generation.logprobs,
                turns_json=getattr(generation, "turns_json", "[]"),
                temperature=self.config.temperature,
                producer=producer,
            )
            for i, generation in enumerate(generations)
        ]

    def guidance(self, tasks: list[GeneratedTask], epoch: int) -> list[RolloutCompleted]:
        """Each task's reference answer as one more rollout of its group (`RunConfig.guidance`): rollout id
        `<task id>-guide`, group index group_size, and as its behaviour log-probabilities the agent's own (teacher-
        forced, at the sampling temperature), so that GRPO's importance weight for it is 1 and its ratio starts at 1."""
        tok, g = self.model.tokenizer, self.config.group_size
        guides = []
        for task in tasks:
            prompt = self.prompt(task.parsed)
            answer = self.domain.reference_answer(task.parsed)
            ids = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            with torch.no_grad():
                logps = sequence_logprobs(self.model.model, prompt_token_ids(tok, [prompt])[0], ids, self.temperature)
            guides.append(
                RolloutCompleted(
                    run_id=self.run_id,
                    epoch=epoch,
                    rollout_id=f"{task.task_id}{GUIDE_SUFFIX}",
                    task_id=task.task_id,
                    group_index=g,
                    agent_model_version=str(self.version),
                    prompt=prompt,
                    completion=answer,
                    completion_token_ids=ids,
                    behaviour_logprobs=logps.tolist(),
                    turns_json="[]",
                    temperature=self.config.temperature,
                    producer=GUIDANCE,
                )
            )
        return guides

    def play(self, tasks: list[Task], seeds: list[int] | None, progress: Tick = _quiet) -> list[list[dict]]:
        """Each task played as an episode of the domain's, turn by turn: a turn is one batched generation over the
        episodes still going (sampled with the episode's seed and the turn's number; greedy without seeds), its
        reply taken as the episode's next command. Each episode's turns: the rendered prompt, the reply with its
        token ids and log-probabilities, the command taken and what the agent then saw."""
        episodes = [self.domain.episode(task) for task in tasks]
        turns: list[list[dict]] = [[] for _ in tasks]
        for turn in range(self.domain.max_turns):
            going = [i for i, episode in enumerate(episodes) if not episode.done]
            if not going:
                break
            prompts = [
                render_prompt(self.model.tokenizer, episodes[i].prompt(), self.domain.agent_system) for i in going
            ]
            turn_seeds = None if seeds is None else [sample_seed(seeds[i], turn) for i in going]
            generations = self.generate(prompts, self.config.agent_max_new_tokens, turn_seeds, greedy=seeds is None)
            for i, generation in zip(going, generations):
                command = episodes[i].step(generation.text)
                turns[i].append(
                    turn_record(
                        generation.prompt,
                        generation.text,
                        generation.token_ids,
                        generation.logprobs,
                        command,
                        episodes[i].observation,
                    )
                )
            progress(turn + 1, self.domain.max_turns)
        return turns

    def reference_turns(self, task: Task) -> list[dict]:
        """The turns of the domain's reference solution played out, as a warm-start rollout's turns_json holds them:
        each turn's prompt and the command as the answer (its tokens, the end-of-text token, log-probabilities 0)."""
        tok, episode, turns = self.model.tokenizer, self.domain.episode(task), []
        for command in self.domain.reference_answer(task).splitlines():
            prompt = render_prompt(tok, episode.prompt(), self.domain.agent_system)
            ids = tok(command, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            episode.step(command)
            turns.append(turn_record(prompt, command, ids, [0.0] * len(ids), command, episode.observation))
        return turns

    def validate(self, tasks: list[Task], progress: Tick = _quiet) -> Validation:
        """Success of greedy answers to `tasks` (the domain's held-out set, generated in batches; in a multi-turn
        domain, greedy episodes), overall and per level."""
        if multi_turn(self.domain):
            answers = ["\n".join(t["command"] for t in turns) for turns in self.play(tasks, None, progress)]
        else:
            prompts = [self.prompt(t) for t in tasks]
            answers = [
                g.text for g in self.generate(prompts, self.config.agent_max_new_tokens, greedy=True, progress=progress)
            ]
        verdicts = [self.domain.check(t, answer) for t, answer in zip(tasks, answers)]
        successes = [v.success for v in verdicts]
        feature = getattr(self.domain, "difficulty_feature", "")
        by_level: dict[str, list[bool]] = {}
        for task, success in zip(tasks, successes):
            level = task.difficulty.get(feature)
            if isinstance(level, (int, float)):
                by_level.setdefault(level_name(level), []).append(success)
        return Validation(
            round(sum(successes) / max(len(tasks), 1), 4),
            {level: round(sum(s) / len(s), 4) for level, s in sorted(by_level.items(), key=lambda x: float(x[0]))},
            tuple(successes),
            tuple(answers),
            tuple(v.detail for v in verdicts),
        )


class Scorer:
    """Rollouts -> rewards (the domain's checker); complete groups of rollouts -> the curriculum's scores."""

    def __init__(self, config: RunConfig, domain: Domain, run_id: str):
        self.config, self.domain, self.run_id = config, domain, run_id

    def verdict(self, task: Task | Invalid, completion: str) -> Verdict:
        """The checker's verdict. A task from the log in a shape the checker cannot read scores 0, with the
        reason, rather than stopping whoever scores it."""
        if isinstance(task, Invalid):
            return Verdict(0.0, False, f"invalid task: {task.reason}")
        try:
            return self.domain.check(task, completion)
        except Exception as exc:  # noqa: BLE001 (any checker failure on foreign data is a 0, never a crash)
            return Verdict(0.0, False, f"unscorable task: {exc.__class__.__name__}")

    def reward(self, task: GeneratedTask, rollout: RolloutCompleted, producer: str = "reward") -> RewardScored:
        verdict = self.verdict(task.parsed, rollout.completion)
        return RewardScored(
            run_id=self.run_id,
            epoch=rollout.epoch,
            rollout_id=rollout.rollout_id,
            task_id=rollout.task_id,
            reward=verdict.reward,
            success=verdict.success,
            checker_detail=verdict.detail,
            producer=producer,
        )

    def seeds(self, tasks: list[GeneratedTask]) -> list[BatchScored]:
        """The warm start's seed tasks, each scored alone on its one rollout, the reference answer. Not at the run's
        granularity: the seeds are no epoch's choices, and at level granularity their groups took epoch 0's names
        (`{run}-e0:level2`), so the epoch's own scores were quarantined as conflicting duplicates and the
        simulator's first update found no rows (docs/RESULTS.md)."""
        return self.groups(tasks, {t.task_id: [True] for t in tasks}, 0, granularity="task", producer="warm-start")

    def groups(
        self,
        tasks: list[GeneratedTask],
        successes: dict[str, list[bool]],
        epoch: int,
        granularity: str | None = None,
        producer: str = "reward",
    ) -> list[BatchScored]:
        """The curriculum's score of every batch of `tasks` (task id -> its rollouts' successes), at the run's
        granularity unless one is given; tasks without rollouts are in no group. At level granularity the groups
        are the levels of all of `tasks` (an epoch's), not of each batch: a batch holds too few tasks a level."""
        curriculum = self.config.curriculum
        if granularity is not None and granularity != curriculum.granularity:
            curriculum = replace(curriculum, granularity=granularity)
        by_level = curriculum.granularity == "level"
        feature = getattr(self.domain, "difficulty_feature", "")
        levels = {
            t.task_id: t.parsed.difficulty[feature]
            for t in tasks
            if isinstance(t.parsed, Task) and feature in t.parsed.difficulty
        }
        by_batch: dict[str, dict[str, list[bool]]] = {}
        for t in tasks:
            group = f"{self.run_id}-e{epoch}" if by_level else t.batch_id
            by_batch.setdefault(group, {})[t.task_id] = successes.get(t.task_id, [])
        return [
            BatchScored(
                run_id=self.run_id,
                epoch=epoch,
                batch_id=s.batch_id,
                task_ids=s.task_ids,
                granularity=curriculum.granularity,
                p_hat=s.p_hat,
                env_reward=s.env_reward,
                weight=s.weight,
                filtered=s.filtered,
                n_tasks=len(s.task_ids),
                n_rollouts=s.n_rollouts,
                n_success=s.n_success,
                producer=producer,
            )
            for batch_id, members in by_batch.items()
            for s in score_groups(batch_id, members, curriculum, levels)
        ]


def checkpoint_event(record: CheckpointRecord, run_id: str, epoch: int) -> CheckpointPublished:
    """The event that asks the lake to register a checkpoint (it does after the registry's checks)."""
    return CheckpointPublished(
        run_id=run_id, epoch=epoch, producer=f"trainer-{record.model_kind}", **record.event_fields()
    )


class Updater:
    """A pool version -> a checkpoint: GRPO on gold/d_train for the agent, RWR on gold/d_env for the simulator.
    Reads the pool at one Delta version, writes the checkpoint folder; registering it is the lake's job.
    Consecutive updates continue one AdamW and its schedule through the state saved beside each checkpoint
    (trainers/checkpoints.py), so the sync loop, the async trainers, a resume and a replay all continue the same
    optimiser."""

    def __init__(self, kind: str, config: RunConfig, run_id: str):
        self.kind, self.config, self.run_id = kind, config, run_id
        self.options = config.agent if kind == "agent" else config.env

    def update(
        self,
        lake: Lake,
        parent_version: int,
        *,
        pool_version: int | None = None,
        options=None,
        warm_start: bool = False,
        progress: Tick | None = None,
    ) -> CheckpointRecord:
        """One update from checkpoint `parent_version` on the pool's rows it has not seen (trainers.TrainError
        when there are none to train on)."""
        base = self.config.agent_model if self.kind == "agent" else self.config.env_model
        return train_update(
            self.kind,
            lake,
            options or self.options,
            base_model=base,
            pool_version=pool_version,
            parent_version=parent_version,
            run_id=self.run_id,
            warm_start=warm_start,
            precision=self.config.precision,
            progress=progress,
        )

    def event(self, record: CheckpointRecord, epoch: int) -> CheckpointPublished:
        return checkpoint_event(record, self.run_id, epoch)
