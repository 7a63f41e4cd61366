"""Async (streaming) mode: each co-evolution role as a long-running worker; nobody waits for an epoch.

    simulator    Simulator: tasks of round r, once the lake shows round r-1's valid tasks all scored (at most one
                 round ahead); takes the run's newest simulator checkpoint from the registry before each round
    rollout      Rollouts: group_size rollouts of every valid task of its partitions, with whatever agent it
                 holds (the registry's newest, looked up every few seconds), so rollouts may come from an older
                 agent than the trainer's
    reward       Scorer: checks every rollout, and scores each task with the curriculum once its group is
                 complete (streaming is always task granularity: a batch's membership is known only after its round)
    ingest       `genenv ingest`: the only writer of the lake
    train-agent  Updater(agent): GRPO whenever the pool holds a batch's worth of new rollouts of the run; rows
                 more than agent.max_staleness versions behind its parent are dropped (or importance-weighted)
    train-env    Updater(env): RWR whenever d_env holds new in-band generations of the run

Workers find each other only through Kafka and the lake. The rollout and reward workers are members of a
consumer group per role and run (`genenv-<run>-rollout`, `genenv-<run>-reward`): N workers of a role share
the partitions, so each task is rolled out once and scored once, and a restarted worker goes on from its
group's committed offsets, never from offset 0. They commit only after their output is published (the reward
worker holds a task's messages until its group is scored: streams/offsets.py), so a crash repeats work
rather than losing it; the repeated events carry the same ids, and the lake keeps the first. Everything
else a worker needs is read from the lake, the record of what is done: the newest checkpoint of its
kind (checked against the registry's sha256), and for the simulator and the trainers their whole
progress. Building a worker opens nothing: `run(stop)` connects, loads the role's model and loops until
`stop()` says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
from collections.abc import Callable
from itertools import groupby

import polars as pl
from deltalake.exceptions import DeltaError
from kafka import ConsumerRebalanceListener, TopicPartition
from kafka.errors import CommitFailedError, KafkaError

from lake import Lake, RunRows, StorageError
from streams import EventProducer, HeldOffsets, TaskGenerated, TaskReassigned, decode, ensure_topics, group_consumer
from trainers import TrainError, latest_version, manifest
from trainers.update import POOL_OF, new_rows

from ..coevolution import (
    GeneratedTask,
    Rollouts,
    RunConfig,
    Scorer,
    Simulator,
    Updater,
    generated_task,
    record_run_config,
    run_version,
)
from ..domains import Invalid, get_domain

IDLE_S = 5.0  # a trainer takes fewer rows than a batch's worth once the pool has not grown for this long
RELOAD_S = 2.0  # how often a worker looks in the registry for a newer checkpoint of its kind
POLL_S = 1.0  # how often the lake-driven workers (simulator, trainers) look at the lake
Stop = Callable[[], bool]
TRANSIENT = (KafkaError, DeltaError, OSError, StorageError)  # a broker or storage error a worker retries (run)
RETRIES = 5


def run_event(message, run_id: str):
    """The message's event if it belongs to the run, else None (malformed ones are the ingestor's business)."""
    try:
        event = decode(message.value)
    except ValueError:
        return None
    return event if event.run_id == run_id and event.producer != "warm-start" else None


def worker_name(role: str) -> str:
    """Who did a piece of work, as its events' `producer` says: GENENV_WORKER_NAME, else role@host:pid."""
    return os.environ.get("GENENV_WORKER_NAME") or f"{role}@{socket.gethostname()}:{os.getpid()}"


class Worker:
    """What every worker shares: its run, the lake it reads, a producer for its events (opened by `run`)."""

    role = ""
    topics: tuple[str, ...] = ()

    co_partitioned = False  # the member needs a task's events from every topic (group_consumer)

    def __init__(self, config: RunConfig, lake: Lake, bootstrap: str, run_id: str, say=print):
        self.config, self.lake, self.bootstrap, self.run_id, self.say = config, lake, bootstrap, run_id, say
        self.domain = get_domain(config.domain, config.seeds_path)
        self.name = worker_name(self.role)
        self.producer: EventProducer | None = None
        self.consumer = None
        self._looked = 0.0
        self._held: list = []  # the model roles of the current attempt (`holding`)

    @property
    def group_id(self) -> str:
        return f"genenv-{self.run_id}-{self.role}"

    def run(self, stop: Stop) -> None:
        """Connect and loop until `stop()`. A broker or storage error (the broker restarting, a storage hiccup)
        closes the connections, waits (2, 4, 8, ... s) and starts again from what the lake and the group's
        committed offsets say; after RETRIES failures in a row the error is raised (and a supervisor restarts
        the process)."""
        # Every worker of a run records its config (the first one writes it): replay and audit read it back.
        record_run_config(self.lake, self.run_id, dataclasses.replace(self.config, run_id=self.run_id))
        failures = 0
        while True:
            try:
                self.connect()
                self.loop(self.consumer, stop)
                return
            except TRANSIENT as exc:
                failures += 1
                if failures > RETRIES:
                    raise
                delay = 2.0**failures
                self.say(
                    f"{self.role}: {exc.__class__.__name__}: {str(exc)[:200]}; "
                    f"retry {failures}/{RETRIES} in {delay:.0f}s"
                )
                time.sleep(delay)
            finally:
                self.disconnect()
                self.release()

    def holding(self, role):
        """`role` (a model role the loop builds), released when this attempt of `run` ends: a retry builds new
        roles, and an old one's vLLM engine would otherwise keep its GPU memory beside the new one's."""
        self._held.append(role)
        return role

    def release(self) -> None:
        for role in self._held:
            role.release()
        self._held.clear()

    def connect(self) -> None:
        ensure_topics(self.bootstrap)
        self.producer = EventProducer(self.bootstrap, client_id=f"genenv-{self.role}")
        if self.topics:
            self.reset()
            self.consumer = group_consumer(
                self.bootstrap,
                self.topics,
                self.group_id,
                client_id=f"genenv-{self.role}",
                co_partitioned=self.co_partitioned,
                listener=self.listener(),
            )

    def disconnect(self) -> None:
        for client, close in (
            (self.consumer, lambda c: c.close(autocommit=False)),
            (self.producer, lambda p: p.close()),
        ):
            if client is not None:
                with contextlib.suppress(Exception):  # closing after a broker error may fail again; nothing to keep
                    close(client)
        self.consumer = self.producer = None

    def reset(self) -> None:
        """Forget what was read but not committed: a new consumer reads it again."""

    def loop(self, consumer, stop: Stop) -> None:
        raise NotImplementedError

    def listener(self):
        return None

    def publish(self, events) -> None:
        """Every event acknowledged, or DeliveryError (a KafkaError: run() retries from the committed offsets)."""
        self.producer.publish(events)

    def commit(self, offsets=None) -> None:
        """Commit after the work is published. A commit refused because the group rebalanced meanwhile loses
        nothing: whoever holds the partitions now reads those messages again."""
        try:
            self.consumer.commit(offsets)
        except CommitFailedError as exc:
            self.say(f"{self.role}: commit refused ({exc.__class__.__name__}); the group reads those messages again")

    def refresh(self, role, every: float = RELOAD_S) -> None:
        """Load the run's newest registered checkpoint of the role's kind (first call: whatever it is; then only
        when newer than the role's), looking at most once per `every` seconds."""
        if role.model is not None and time.monotonic() - self._looked < every:
            return
        self._looked = time.monotonic()
        newest = run_version(self.lake, role.kind, self.run_id)
        if role.model is None or newest > role.version:
            role.load(self.lake, newest)


class SimulatorWorker(Worker):
    """One per run. Its progress is the lake's: a restarted simulator goes on after the last round the lake holds
    (a round it wrote but the lake has not landed is written again, under the same task ids)."""

    role = "simulator"

    def loop(self, consumer, stop: Stop) -> None:
        cfg = self.config
        simulator = self.holding(Simulator(cfg, self.domain, self.run_id))
        run = RunRows(self.lake, self.run_id)
        valid_in = run.valid_per_epoch()  # valid tasks of each round written (the lake's, then this worker's)
        round_ = max(valid_in, default=-1) + 1
        barren = 0  # rounds in a row without a valid task
        while (cfg.epochs == 0 or round_ < cfg.epochs) and not stop():
            if round_ > 0 and run.scored_per_epoch().get(round_ - 1, 0) < valid_in.get(round_ - 1, 0):
                time.sleep(POLL_S)
                continue
            if simulator.needs_model:
                self.refresh(simulator, every=0)
            recent = run.outcomes()[-4 * cfg.tasks_per_epoch * cfg.group_size :]
            published, valid = simulator.tasks_for(round_, recent)
            valid_in[round_] = len(valid)
            self.publish([simulator.event(t, producer=self.name) for t in published])
            self.say(
                f"simulator: round {round_}: {len(valid)} valid tasks of {len(published)} written "
                f"(env v{simulator.version})"
            )
            round_ += 1
            # Rounds without a valid task wait for nothing: without a pause an unbounded run would write them as
            # fast as the simulator generates. Wait 2, 4, ... 60 s, for a new checkpoint to write better ones.
            barren = 0 if valid or not published else barren + 1
            until = time.monotonic() + (min(2.0**barren, 60.0) if barren and cfg.epochs == 0 else 0)
            while time.monotonic() < until and not stop():
                time.sleep(0.5)


class RolloutWorker(Worker):
    """Rolls out the tasks of its partitions, a generation batch per poll; commits once their rollouts are sent."""

    role = "rollout"
    topics = ("genenv.tasks",)

    def loop(self, consumer, stop: Stop) -> None:
        rollouts = self.holding(Rollouts(self.config, self.domain, self.run_id))
        per_call = max(1, self.config.generation_batch_size // self.config.group_size)
        while not stop():
            self.refresh(rollouts)
            polled = [m for messages in consumer.poll(timeout_ms=500, max_records=per_call).values() for m in messages]
            tasks = [
                generated_task(e)
                for e in (run_event(m, self.run_id) for m in polled)
                if e is not None and e.KIND == "task"
            ]
            tasks = self.not_in_lake([t for t in tasks if not isinstance(t.parsed, Invalid)])
            for epoch, same_epoch in groupby(sorted(tasks, key=lambda t: t.epoch), key=lambda t: t.epoch):
                self.publish(
                    rollouts.roll_out(list(same_epoch), epoch, producer=self.name)
                )  # the reward worker scores them
            if polled:
                self.commit()

    def not_in_lake(self, tasks: list[GeneratedTask]) -> list[GeneratedTask]:
        """The tasks whose rollouts the lake does not hold yet (a task sent again after a restart or a resume
        needs none)."""
        if not tasks:
            return tasks
        ids = [t.task_id for t in tasks]
        counts = RunRows(self.lake, self.run_id).rollouts_per_task(ids).collect()
        done = {t for t, n in counts.iter_rows() if n >= self.config.group_size}
        return [t for t in tasks if t.task_id not in done]


@dataclasses.dataclass
class PendingGroups:
    """What a reward worker holds between polls: the tasks of its partitions whose groups are not complete (with
    their events, and since when they wait), their rollouts' successes so far, the rollouts whose task has not come
    yet, and the tasks it has scored. A task leaves it whole (`finish`), or with its partition (`forget`)."""

    tasks: dict[str, GeneratedTask] = dataclasses.field(default_factory=dict)
    events: dict[str, TaskGenerated] = dataclasses.field(default_factory=dict)  # task id -> the event it came in
    partition: dict[str, int] = dataclasses.field(default_factory=dict)  # task id -> partition (same in both topics)
    successes: dict[str, dict[str, bool]] = dataclasses.field(default_factory=dict)  # task id -> rollout id -> success
    waiting_since: dict[str, float] = dataclasses.field(default_factory=dict)  # task id -> came, or last re-sent
    reassigned: dict[str, int] = dataclasses.field(default_factory=dict)  # task id -> times re-sent
    early: list = dataclasses.field(default_factory=list)  # (message, rollout) whose task has not come yet
    scored: set[str] = dataclasses.field(default_factory=set)

    def add_task(self, task: GeneratedTask, event: TaskGenerated, partition: int, now: float) -> None:
        if task.task_id not in self.tasks:  # a task written again (a restart, a re-assignment): the first counts
            self.tasks[task.task_id], self.events[task.task_id] = task, event
            self.waiting_since[task.task_id] = now
        self.partition[task.task_id] = partition

    def add_rollout(self, message, rollout) -> None:
        self.early.append((message, rollout))
        self.partition[rollout.task_id] = message.partition

    def score_arrived(self, reward) -> list:
        """Score the rollouts whose task is here (`reward(task, rollout)`), once each: a repeat (a restarted rollout
        worker's) is skipped, as the lake keeps the first; the others wait."""
        out, waiting = [], []
        for message, rollout in self.early:
            task = self.tasks.get(rollout.task_id)
            if task is None:
                waiting.append((message, rollout))
                continue
            done = self.successes.setdefault(rollout.task_id, {})
            if rollout.rollout_id not in done:
                scored = reward(task, rollout)
                out.append(scored)
                done[rollout.rollout_id] = scored.success
        self.early = waiting
        return out

    def complete(self, group_size: int) -> list[tuple[GeneratedTask, list[bool]]]:
        """The tasks whose every rollout is scored, with their successes."""
        return [(self.tasks[t], list(done.values())) for t, done in self.successes.items() if len(done) >= group_size]

    def overdue(self, limit_s: float, now: float) -> list[str]:
        """The tasks whose group has waited more than limit_s since the task came (or was last re-sent)."""
        return [task_id for task_id, since in self.waiting_since.items() if now - since > limit_s]

    def reassign(self, task_id: str, now: float) -> int:
        """Count a re-sending of the task (the clock starts again); its number, 1 for the first."""
        self.waiting_since[task_id] = now
        self.reassigned[task_id] = self.reassigned.get(task_id, 0) + 1
        return self.reassigned[task_id]

    def finish(self, task_id: str) -> None:
        self.scored.add(task_id)
        self._drop(task_id)

    def forget(self, partitions: set[int]) -> None:
        """Drop what came from partitions taken away (their new owner reads it again)."""
        for task_id in [t for t, p in self.partition.items() if p in partitions]:
            self._drop(task_id)
        self.early = [(m, r) for m, r in self.early if m.partition not in partitions]

    def _drop(self, task_id: str) -> None:
        for table in (self.tasks, self.events, self.partition, self.successes, self.waiting_since, self.reassigned):
            table.pop(task_id, None)

    def waiting_task_ids(self) -> set[str]:
        """The tasks that early rollouts wait for."""
        return {r.task_id for _, r in self.early}

    def drop_waiting(self, task_ids: set[str]) -> None:
        """Forget the early rollouts of these tasks (they were scored elsewhere)."""
        self.early = [(m, r) for m, r in self.early if r.task_id not in task_ids]


class RewardWorker(Worker):
    """Scores every rollout of its partitions, and each task with the curriculum once its group is complete. A
    task's message and its rollouts' are held (not committed) until then: streams/offsets.py. A task whose group is
    still incomplete `reassign_after_s` after it came is sent again to genenv.tasks, so that a rollout worker makes
    the rollouts the lake lacks (rollout ids are the task's and the group index: what was made before is not made
    twice), and a TaskReassigned event records it; the clock then starts again."""

    role = "reward"
    topics = ("genenv.tasks", "genenv.rollouts")
    co_partitioned = True  # a task and its rollouts, keyed by task id, come to the same member

    def reset(self) -> None:
        self.held = HeldOffsets()
        self.pending = PendingGroups()
        self.rewind: dict[TopicPartition, int] = {}

    def listener(self):
        worker = self

        class Rebalance(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                worker.give_up(revoked)

            def on_partitions_assigned(self, assigned):
                for tp in assigned:  # kept partitions keep their position: go back to what was committed
                    if tp in worker.rewind:
                        worker.consumer.seek(tp, worker.rewind.pop(tp))

        return Rebalance()

    def give_up(self, revoked) -> None:
        """Before partitions are taken away: commit what is done, forget what waits (their new owner reads it).
        A partition given back to this member is read again from its first held message: kafka-python keeps a
        kept partition's position, and what this forgets must come again (every partition, not only those whose
        offset moved since the last commit: a task held across a rebalance was lost, and its round never ended)."""
        offsets = self.held.to_commit()
        if offsets:
            self.commit(offsets)
            self.held.committed(offsets)
        # Replaced, not added to, at every revocation (an eager rebalance revokes before each assignment): a partition
        # that went to another member and comes back later comes as a new one, from the group's committed offset,
        # which an older rewind would take back past the other member's work.
        positions = self.held.positions()
        self.rewind = {tp: positions[tp] for tp in revoked if tp in positions}
        self.pending.forget({tp.partition for tp in revoked})
        self.held.forget(revoked)

    def loop(self, consumer, stop: Stop) -> None:
        scorer = Scorer(self.config, self.domain, self.run_id)
        looked = time.monotonic()
        while not stop():
            for messages in consumer.poll(timeout_ms=500).values():
                for message in messages:
                    self.take(message)
            out = self.pending.score_arrived(lambda task, rollout: scorer.reward(task, rollout, producer=self.name))
            # Streaming scores each task as soon as its group is complete (task granularity): a batch's
            # membership is not known until the simulator's round is over.
            for task, successes in self.pending.complete(self.config.group_size):
                out += scorer.groups(
                    [task], {task.task_id: successes}, task.epoch, granularity="task", producer=self.name
                )
                self.finished(task.task_id)
            if out:
                self.publish(out)
            if time.monotonic() - looked > IDLE_S:
                looked = time.monotonic()
                if self.pending.early:
                    self.drop_scored_elsewhere()
                self.reassign_overdue()
            offsets = self.held.to_commit()
            if offsets:
                self.commit(offsets)
                self.held.committed(offsets)

    def take(self, message) -> None:
        event = run_event(message, self.run_id)
        if event is None or event.task_id in self.pending.scored or event.KIND not in ("task", "rollout"):
            self.held.seen(message)
            return
        if event.KIND == "task":
            task = generated_task(event)
            if isinstance(task.parsed, Invalid):  # no rollouts will come for it
                self.held.seen(message)
                return
            self.pending.add_task(task, event, message.partition, time.monotonic())
        else:
            self.pending.add_rollout(message, event)
        self.held.hold(message, event.task_id)

    def finished(self, task_id: str) -> None:
        self.pending.finish(task_id)
        self.held.release(task_id)

    def reassign_overdue(self) -> None:
        """Send again the tasks held past reassign_after_s with their group incomplete, each with its record."""
        now = time.monotonic()
        events = []
        for task_id in self.pending.overdue(self.config.reassign_after_s, now):
            held_s = now - self.pending.waiting_since[task_id]
            task = self.pending.events[task_id]
            missing = self.config.group_size - len(self.pending.successes.get(task_id, {}))
            events += [
                task,
                TaskReassigned(
                    run_id=self.run_id,
                    epoch=task.epoch,
                    task_id=task_id,
                    rollouts_missing=missing,
                    held_s=round(held_s, 3),
                    reassignment=self.pending.reassign(task_id, now),
                    producer=self.name,
                ),
            ]
            self.say(f"reward: task {task_id} held {held_s:.0f}s with {missing} rollouts missing: sent again")
        if events:
            self.publish(events)

    def drop_scored_elsewhere(self) -> None:
        """Rollouts whose task never comes: repeats of rollouts of a task scored before this worker started (its
        task message was committed past). The lake says which; they need no second score."""
        waiting = self.pending.waiting_task_ids()
        scored = RunRows(self.lake, self.run_id).scored_ids().filter(pl.col("task_id").is_in(list(waiting)))
        done = set(scored.collect()["task_id"].to_list())
        for task_id in done:
            self.finished(task_id)
        self.pending.drop_waiting(done)


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
        updater = Updater(kind, cfg, self.run_id)
        parent = run_version(self.lake, kind, self.run_id)
        validator = None
        if kind == "agent":
            validator = self.holding(Rollouts(cfg, self.domain, self.run_id))
            validation = self.domain.validation_set(cfg.validation_size)
        minimum = cfg.batch_size * cfg.group_size if kind == "agent" else 1
        updates, last_count, last_change = 0, 0, time.monotonic()
        # The pool is read again only when its version or the parent moves (a read is the whole table at two
        # versions, and a long run's pool is large); an update that found nothing to train on is not tried again
        # on the same two.
        looked_at, refused = None, None
        while (cfg.epochs == 0 or updates < cfg.epochs) and not stop():
            time.sleep(1.0)
            pool_version = self.lake.version(f"gold/{POOL_OF[kind]}")
            if (pool_version, parent) != looked_at:
                seen = manifest(self.lake, kind, parent)["pool_version"] if parent else None
                rows = new_rows(self.lake, POOL_OF[kind], pool_version, seen)
                rows = rows.filter(rows["run_id"] == self.run_id)
                looked_at = (pool_version, parent)
            if rows.height != last_count:
                last_count, last_change = rows.height, time.monotonic()
            # A batch's worth of new rows, or fewer once nothing new has landed for a while (the run's tail).
            if rows.height == 0 or (rows.height < minimum and time.monotonic() - last_change < IDLE_S):
                continue
            if refused == looked_at:
                continue
            try:
                record = updater.update(self.lake, parent, pool_version=pool_version)
            except TrainError:
                refused = looked_at
                continue  # nothing new (or all filtered / too stale) yet
            if validator is not None:
                validator.load(self.lake, record.version, record.sha256)
                result = validator.validate(validation)
                record.metrics.update(validation_accuracy=result.accuracy, validation_by_level=result.by_level)
            self.publish([updater.event(record, int(rows["epoch"].max()))])
            while not stop() and latest_version(self.lake, kind) < record.version:
                time.sleep(0.5)  # the ingest worker registers it; the next update's lineage needs the row
            parent = record.version
            updates += 1
            self.say(
                f"train-{kind}: v{record.version} on {record.metrics['rows']} rows "
                f"(left out: {record.metrics['rows_left_out']}; optimiser {record.metrics['optimizer']})"
            )


WORKERS = {"simulator": SimulatorWorker, "rollout": RolloutWorker, "reward": RewardWorker}
ROLES = ("simulator", "rollout", "reward", "train-agent", "train-env")


def worker(role: str, config: RunConfig, lake: Lake, bootstrap: str, run_id: str, say=print) -> Worker:
    """The worker for a role name (`genenv worker ROLE`); building it opens nothing."""
    if role not in ROLES:
        raise ValueError(f"unknown worker role {role!r}; roles: {', '.join(ROLES)} (and `genenv ingest`)")
    if role.startswith("train-"):
        return TrainerWorker(role.removeprefix("train-"), config, lake, bootstrap, run_id, say)
    return WORKERS[role](config, lake, bootstrap, run_id, say)
