"""Async (streaming) mode: every role is a long-running Kafka consumer; nobody waits for an epoch to end.

    simulator    tasks of round r, once round r-1's valid tasks are all scored (at most one round ahead);
                 reloads its weights on CheckpointPublished(env)
    rollout      group_size rollouts of every valid task with whatever agent it holds; reloads on
                 CheckpointPublished(agent), so rollouts may come from an older agent than the trainer's
    reward       checks every rollout, and scores each task with the curriculum once its group is complete
                 (streaming is always task granularity: a batch's membership is known only after its round)
    ingest       `genenv ingest`: the only writer of the lake
    train-agent  GRPO whenever the pool holds a batch's worth of new rollouts of the run; rows more than
                 agent.max_staleness versions behind its parent are dropped (or importance-weighted)
    train-env    RWR whenever d_env holds new in-band generations of the run

Workers find each other only through Kafka and the lake. Each consumes its topics from the start
and keeps what belongs to its run; its state is rebuilt from the log on restart. A worker loads the
checkpoint a CheckpointPublished event names after checking the event's sha256.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, defaultdict
from collections.abc import Callable

from lake import Lake
from streams import CheckpointPublished, EventProducer, RewardScored, assigned_consumer, decode, ensure_topics
from trainers import TrainError, latest_version, load_published, manifest, registry, train_update
from trainers.update import POOL_OF, new_rows

from .config import RunConfig
from .domains import Invalid, Task, Verdict, task_from_row
from .curriculum import score_groups
from .loop import Engine, GeneratedTask

IDLE_S = 5.0  # a trainer takes fewer rows than a batch's worth once the pool has not grown for this long
ROLES = ("simulator", "rollout", "reward", "train-agent", "train-env")
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


def run_version(lake: Lake, kind: str, run_id: str) -> int:
    """The newest checkpoint of this run (its warm start, for a fresh run); 0 when it has none."""
    rows = registry(lake, kind)
    rows = rows.filter(rows["run_id"] == run_id)
    return int(rows["version"].max()) if rows.height else 0


class Worker:
    def __init__(self, role: str, config: RunConfig, lake: Lake, bootstrap: str, run_id: str, say=print):
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}; roles: {', '.join(ROLES)} (and `genenv ingest`)")
        self.role, self.config, self.lake, self.bootstrap, self.run_id, self.say = role, config, lake, bootstrap, run_id, say
        ensure_topics(bootstrap)
        self.producer = EventProducer(bootstrap, client_id=f"genenv-{role}")

    def run(self, stop: Stop) -> None:
        try:
            getattr(self, self.role.replace("-", "_"))(stop)
        finally:
            self.producer.close()

    def publish(self, events) -> None:
        for event in events:
            self.producer.send(event)
        self.producer.flush()

    def _engine(self, roles: tuple[str, ...]) -> Engine:
        start_from = (run_version(self.lake, "agent", self.run_id), run_version(self.lake, "env", self.run_id))
        return Engine(self.config, self.lake, None, say=self.say, run_id=self.run_id, roles=roles, start_from=start_from)

    @staticmethod
    def _reload(engine: Engine, event) -> None:
        """Take the weights a CheckpointPublished event names, if they are newer than what the engine holds."""
        if event.model_kind == "agent" and "agent" in engine.roles and event.version > engine.agent_version:
            engine.agent = load_published(engine.lake, "agent", event.version, event.sha256)
            engine.agent_version = event.version
        elif event.model_kind == "env" and "env" in engine.roles and event.version > engine.env_version:
            engine.simulator = load_published(engine.lake, "env", event.version, event.sha256)
            engine.env_version = event.version

    # -- roles ------------------------------------------------------------------------------------------
    def simulator(self, stop: Stop) -> None:
        engine = self._engine(("env",))
        consumer = assigned_consumer(self.bootstrap, ["genenv.batches", "genenv.checkpoints", "genenv.rewards"],
                                     client_id="genenv-simulator")
        scored: Counter = Counter()  # epoch -> tasks scored
        valid_in: dict[int, int] = {}  # epoch -> valid tasks generated
        history: list = []
        difficulty: dict[str, dict] = {}
        round_ = 0
        while round_ < self.config.epochs and not stop():
            for event in run_events(consumer, self.run_id):
                if event.KIND == "checkpoint":
                    self._reload(engine, event)
                elif event.KIND == "batch":
                    scored[event.epoch] += event.n_tasks
                elif event.KIND == "reward" and event.task_id in difficulty:
                    history.append((difficulty[event.task_id], event.success))
            if round_ > 0 and scored[round_ - 1] < valid_in[round_ - 1]:
                continue
            engine.history = history[-4 * self.config.tasks_per_epoch * self.config.group_size:]
            published, valid = engine.tasks_for(round_)
            valid_in[round_] = len(valid)
            difficulty.update({t.task_id: t.parsed.difficulty for t in valid})
            self.publish([engine._task_event(t) for t in published])
            self.say(f"simulator: round {round_}: {len(valid)} valid tasks of {len(published)} written (env v{engine.env_version})")
            round_ += 1
        consumer.close()

    def rollout(self, stop: Stop) -> None:
        engine = self._engine(("agent",))
        consumer = assigned_consumer(self.bootstrap, ["genenv.tasks", "genenv.checkpoints"], client_id="genenv-rollout")
        per_call = max(1, self.config.generation_batch_size // self.config.group_size)
        waiting: list[GeneratedTask] = []
        calls = 0
        while not stop():
            for event in run_events(consumer, self.run_id):
                if event.KIND == "checkpoint":
                    self._reload(engine, event)
                elif event.KIND == "task" and event.producer != "warm-start":
                    task = task_of(event)
                    if isinstance(task, Invalid):
                        continue
                    waiting.append(GeneratedTask(event.task_id, event.batch_id, event.sim_prompt, event.raw_generation,
                                                 task, event.env_model_version, event.epoch))
            while waiting and not stop():
                batch, waiting = waiting[:per_call], waiting[per_call:]
                events, *_ = engine.roll_out(batch, batch[0].epoch, salt=10_000 + calls, score=False)
                calls += 1
                self.publish(events)  # the reward worker scores them
        consumer.close()

    def reward(self, stop: Stop) -> None:
        engine = self._engine(())
        cfg = self.config
        consumer = assigned_consumer(self.bootstrap, ["genenv.tasks", "genenv.rollouts"], client_id="genenv-reward")
        by_task = dataclasses.replace(cfg.curriculum, granularity="task")
        tasks: dict[str, GeneratedTask] = {}
        successes: dict[str, list[bool]] = defaultdict(list)
        early: list = []  # rollouts whose task has not arrived yet
        scored: set[str] = set()
        while not stop():
            for event in run_events(consumer, self.run_id):
                if event.KIND == "task" and event.producer != "warm-start":
                    parsed = task_of(event)
                    tasks[event.task_id] = GeneratedTask(event.task_id, event.batch_id, event.sim_prompt,
                                                         event.raw_generation, parsed, event.env_model_version, event.epoch)
                elif event.KIND == "rollout" and event.producer != "warm-start":
                    early.append(event)
            ready, early = [e for e in early if e.task_id in tasks], [e for e in early if e.task_id not in tasks]
            out = []
            for rollout in ready:
                task = tasks[rollout.task_id]
                try:
                    verdict = engine.domain.check(task.parsed, rollout.completion)
                except Exception as exc:  # noqa: BLE001 (a task from the log in a shape the checker cannot read)
                    verdict = Verdict(0.0, False, f"unscorable task: {exc.__class__.__name__}")
                out.append(RewardScored(
                    run_id=self.run_id, epoch=rollout.epoch, rollout_id=rollout.rollout_id, task_id=rollout.task_id,
                    reward=verdict.reward, success=verdict.success, checker_detail=verdict.detail, producer="reward"))
                successes[rollout.task_id].append(verdict.success)
            # Streaming scores each task as soon as its group is complete (task granularity): a batch's
            # membership is not known until the simulator's round is over.
            for task_id in list(successes):
                task = tasks.get(task_id)
                if task is None or task_id in scored or len(successes[task_id]) < cfg.group_size:
                    continue
                scored.add(task_id)
                out += [engine._batch_event(s, task.epoch, granularity="task")
                        for s in score_groups(task.batch_id, {task_id: successes[task_id]}, by_task)]
            if out:
                self.publish(out)
        consumer.close()

    def train_agent(self, stop: Stop) -> None:
        self._train("agent", self.config.agent, stop)

    def train_env(self, stop: Stop) -> None:
        if self.config.mode == "genenv":
            self._train("env", self.config.env, stop)

    def _train(self, kind: str, options, stop: Stop) -> None:
        """Update whenever the pool holds enough new rows of the run; stop after `epochs` updates."""
        cfg = self.config
        base = cfg.agent_model if kind == "agent" else cfg.env_model
        parent = run_version(self.lake, kind, self.run_id)
        engine = self._engine(("agent",)) if kind == "agent" else None
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
                record = train_update(kind, self.lake, options, base_model=base, pool_version=pool_version,
                                      parent_version=parent, run_id=self.run_id)
            except TrainError:
                continue  # nothing new (or all filtered / too stale) yet
            if engine is not None:
                engine.agent = load_published(self.lake, kind, record.version, record.sha256)
                record.metrics["validation_accuracy"] = round(engine.validate(), 4)
            epoch = int(rows["epoch"].max())
            self.publish([CheckpointPublished(
                run_id=self.run_id, epoch=epoch, producer=f"trainer-{kind}", **record.event_fields())])
            while not stop() and latest_version(self.lake, kind) < record.version:
                time.sleep(0.5)  # the ingest worker registers it; the next update's lineage needs the row
            parent = record.version
            updates += 1
            self.say(f"train-{kind}: v{record.version} on {record.metrics['rows']} rows "
                     f"(left out: {record.metrics['rows_left_out']})")
