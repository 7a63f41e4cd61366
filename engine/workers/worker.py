"""Async (streaming) mode: each co-evolution role wrapped in a long-running Kafka consumer loop; nobody waits for an epoch.

    simulator    Simulator: tasks of round r, once round r-1's valid tasks are all scored (at most one round
                 ahead); reloads its weights on CheckpointPublished(env)
    rollout      Rollouts: group_size rollouts of every valid task with whatever agent it holds; reloads on
                 CheckpointPublished(agent), so rollouts may come from an older agent than the trainer's
    reward       Scorer: checks every rollout, and scores each task with the curriculum once its group is
                 complete (streaming is always task granularity: a batch's membership is known only after its round)
    ingest       `genenv ingest`: the only writer of the lake
    train-agent  Updater(agent): GRPO whenever the pool holds a batch's worth of new rollouts of the run; rows
                 more than agent.max_staleness versions behind its parent are dropped (or importance-weighted)
    train-env    Updater(env): RWR whenever d_env holds new in-band generations of the run

Workers find each other only through Kafka and the lake. Each consumes its topics from the start and keeps
what belongs to its run; its state is rebuilt from the log on restart. A worker loads the checkpoint a
CheckpointPublished event names after checking the event's sha256. Building a worker opens nothing:
`run(stop)` connects, loads the role's model and loops until `stop()` says so.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, defaultdict
from collections.abc import Callable

from lake import Lake
from streams import EventProducer, assigned_consumer, decode, ensure_topics
from trainers import TrainError, latest_version, manifest, registry
from trainers.update import POOL_OF, new_rows

from ..coevolution import GeneratedTask, RunConfig, Rollouts, Scorer, Simulator, Updater, record_run_config
from ..domains import Invalid, Task, get_domain, task_from_row

IDLE_S = 5.0  # a trainer takes fewer rows than a batch's worth once the pool has not grown for this long
Stop = Callable[[], bool]


def run_events(consumer, run_id: str, timeout_ms: int = 500):
    """Decoded events of one run from a poll (malformed ones are the ingestor's business, not ours)."""
    for messages in consumer.poll(timeout_ms=timeout_ms).values():
        for message in messages:
            try:
                event = decode(message.value)
            except ValueError:
                continue
            if event.run_id == run_id:
                yield event


def task_of(event) -> Task | Invalid:
    """The task a TaskGenerated carries. Its JSON fields are a producer's text: one that does not parse makes the
    task invalid, never stops the worker (the ingestor keeps the event; docs/EVENTS.md)."""
    if not event.valid:
        return Invalid(event.invalid_reason or "")
    try:
        return task_from_row(event.to_dict())
    except (ValueError, RecursionError, TypeError, KeyError) as exc:
        return Invalid(f"unreadable task fields: {exc.__class__.__name__}")


def generated_task(event) -> GeneratedTask:
    return GeneratedTask(event.task_id, event.batch_id, event.sim_prompt, event.raw_generation, task_of(event),
                         event.env_model_version, event.epoch)


def run_version(lake: Lake, kind: str, run_id: str) -> int:
    """The newest checkpoint of this run (its warm start, for a fresh run); 0 when it has none."""
    rows = registry(lake, kind)
    rows = rows.filter(rows["run_id"] == run_id)
    return int(rows["version"].max()) if rows.height else 0


class Worker:
    """What every worker shares: its run, the lake it reads, a producer for its events (opened by `run`)."""

    role = ""
    topics: tuple[str, ...] = ()

    def __init__(self, config: RunConfig, lake: Lake, bootstrap: str, run_id: str, say=print):
        self.config, self.lake, self.bootstrap, self.run_id, self.say = config, lake, bootstrap, run_id, say
        self.domain = get_domain(config.domain, config.seeds_path)
        self.producer: EventProducer | None = None

    def run(self, stop: Stop) -> None:
        # Every worker of a run records its config (the first one writes it): replay and audit read it back.
        record_run_config(self.lake.root, self.run_id, dataclasses.replace(self.config, run_id=self.run_id))
        ensure_topics(self.bootstrap)
        self.producer = EventProducer(self.bootstrap, client_id=f"genenv-{self.role}")
        consumer = assigned_consumer(self.bootstrap, list(self.topics), client_id=f"genenv-{self.role}") if self.topics else None
        try:
            self.loop(consumer, stop)
        finally:
            if consumer is not None:
                consumer.close()
            self.producer.close()

    def loop(self, consumer, stop: Stop) -> None:
        raise NotImplementedError

    def publish(self, events) -> None:
        for event in events:
            self.producer.send(event)
        self.producer.flush()

    def reload(self, role, event) -> None:
        """Take the weights a CheckpointPublished event names, if they are the role's kind and newer than its own."""
        if event.model_kind == role.kind and event.version > role.version:
            role.load(self.lake, event.version, event.sha256)


class SimulatorWorker(Worker):
    role = "simulator"
    topics = ("genenv.batches", "genenv.checkpoints", "genenv.rewards")

    def loop(self, consumer, stop: Stop) -> None:
        cfg = self.config
        simulator = Simulator(cfg, self.domain, self.run_id)
        if simulator.needs_model:
            simulator.load(self.lake, run_version(self.lake, "env", self.run_id))
        scored: Counter = Counter()  # epoch -> tasks scored
        valid_in: dict[int, int] = {}  # epoch -> valid tasks generated
        history: list = []
        difficulty: dict[str, dict] = {}
        round_ = 0
        while round_ < cfg.epochs and not stop():
            for event in run_events(consumer, self.run_id):
                if event.KIND == "checkpoint" and simulator.needs_model:
                    self.reload(simulator, event)
                elif event.KIND == "batch":
                    scored[event.epoch] += event.n_tasks
                elif event.KIND == "reward" and event.task_id in difficulty:
                    history.append((difficulty[event.task_id], event.success))
            if round_ > 0 and scored[round_ - 1] < valid_in[round_ - 1]:
                continue
            recent = history[-4 * cfg.tasks_per_epoch * cfg.group_size:]
            published, valid = simulator.tasks_for(round_, recent)
            valid_in[round_] = len(valid)
            difficulty.update({t.task_id: t.parsed.difficulty for t in valid})
            self.publish([simulator.event(t) for t in published])
            self.say(f"simulator: round {round_}: {len(valid)} valid tasks of {len(published)} written (env v{simulator.version})")
            round_ += 1


class RolloutWorker(Worker):
    role = "rollout"
    topics = ("genenv.tasks", "genenv.checkpoints")

    def loop(self, consumer, stop: Stop) -> None:
        rollouts = Rollouts(self.config, self.domain, self.run_id)
        rollouts.load(self.lake, run_version(self.lake, "agent", self.run_id))
        per_call = max(1, self.config.generation_batch_size // self.config.group_size)
        waiting: list[GeneratedTask] = []
        while not stop():
            for event in run_events(consumer, self.run_id):
                if event.KIND == "checkpoint":
                    self.reload(rollouts, event)
                elif event.KIND == "task" and event.producer != "warm-start":
                    task = generated_task(event)
                    if not isinstance(task.parsed, Invalid):
                        waiting.append(task)
            while waiting and not stop():
                batch, waiting = waiting[:per_call], waiting[per_call:]
                self.publish(rollouts.roll_out(batch, batch[0].epoch))  # the reward worker scores them


class RewardWorker(Worker):
    role = "reward"
    topics = ("genenv.tasks", "genenv.rollouts")

    def loop(self, consumer, stop: Stop) -> None:
        scorer = Scorer(self.config, self.domain, self.run_id)
        tasks: dict[str, GeneratedTask] = {}
        successes: dict[str, list[bool]] = defaultdict(list)
        early: list = []  # rollouts whose task has not arrived yet
        scored: set[str] = set()
        while not stop():
            for event in run_events(consumer, self.run_id):
                if event.KIND == "task" and event.producer != "warm-start":
                    tasks[event.task_id] = generated_task(event)
                elif event.KIND == "rollout" and event.producer != "warm-start":
                    early.append(event)
            ready, early = [e for e in early if e.task_id in tasks], [e for e in early if e.task_id not in tasks]
            out = []
            for rollout in ready:
                reward = scorer.reward(tasks[rollout.task_id], rollout)
                out.append(reward)
                successes[rollout.task_id].append(reward.success)
            # Streaming scores each task as soon as its group is complete (task granularity): a batch's
            # membership is not known until the simulator's round is over.
            for task_id in list(successes):
                task = tasks.get(task_id)
                if task is None or task_id in scored or len(successes[task_id]) < self.config.group_size:
                    continue
                scored.add(task_id)
                out += scorer.groups([task], {task_id: successes[task_id]}, task.epoch, granularity="task")
            if out:
                self.publish(out)


class TrainerWorker(Worker):
    """Update whenever the pool holds enough new rows of the run; stop after `epochs` updates. The agent's
    checkpoints carry their validation accuracy, measured here with a Rollouts role."""

    def __init__(self, kind: str, config: RunConfig, lake: Lake, bootstrap: str, run_id: str, say=print):
        super().__init__(config, lake, bootstrap, run_id, say)
        self.kind = kind
        self.role = f"train-{kind}"

    def loop(self, consumer, stop: Stop) -> None:
        cfg, kind = self.config, self.kind
        if kind == "env" and cfg.mode != "genenv":
            return  # only genenv trains its simulator
        updater = Updater(kind, cfg, self.run_id, keep_optimizer=True)  # one AdamW for the worker's life
        parent = run_version(self.lake, kind, self.run_id)
        validator = None
        if kind == "agent":
            validator = Rollouts(cfg, self.domain, self.run_id)
            validation = self.domain.validation_set(cfg.validation_size)
        minimum = cfg.batch_size * cfg.group_size if kind == "agent" else 1
        updates, last_count, last_change = 0, 0, time.monotonic()
        while updates < cfg.epochs and not stop():
            time.sleep(1.0)
            pool_version = self.lake.version(f"gold/{POOL_OF[kind]}")
            seen = manifest(self.lake, kind, parent)["pool_version"] if parent else None
            rows = new_rows(self.lake, POOL_OF[kind], pool_version, seen)
            rows = rows.filter(rows["run_id"] == self.run_id)
            if rows.height != last_count:
                last_count, last_change = rows.height, time.monotonic()
            # A batch's worth of new rows, or fewer once nothing new has landed for a while (the run's tail).
            if rows.height == 0 or (rows.height < minimum and time.monotonic() - last_change < IDLE_S):
                continue
            try:
                record = updater.update(self.lake, parent, pool_version=pool_version)
            except TrainError:
                continue  # nothing new (or all filtered / too stale) yet
            if validator is not None:
                validator.load(self.lake, record.version, record.sha256)
                record.metrics["validation_accuracy"] = round(validator.validate(validation), 4)
            self.publish([updater.event(record, int(rows["epoch"].max()))])
            while not stop() and latest_version(self.lake, kind) < record.version:
                time.sleep(0.5)  # the ingest worker registers it; the next update's lineage needs the row
            parent = record.version
            updates += 1
            self.say(f"train-{kind}: v{record.version} on {record.metrics['rows']} rows "
                     f"(left out: {record.metrics['rows_left_out']}; optimiser {record.metrics['optimizer']})")


WORKERS = {"simulator": SimulatorWorker, "rollout": RolloutWorker, "reward": RewardWorker}
ROLES = ("simulator", "rollout", "reward", "train-agent", "train-env")


def worker(role: str, config: RunConfig, lake: Lake, bootstrap: str, run_id: str, say=print) -> Worker:
    """The worker for a role name (`genenv worker ROLE`); building it opens nothing."""
    if role not in ROLES:
        raise ValueError(f"unknown worker role {role!r}; roles: {', '.join(ROLES)} (and `genenv ingest`)")
    if role.startswith("train-"):
        return TrainerWorker(role.removeprefix("train-"), config, lake, bootstrap, run_id, say)
    return WORKERS[role](config, lake, bootstrap, run_id, say)
