"""Continuous streaming at scale: several workers per role in consumer groups, and workers that die and come back.

Real broker (the local Tansu), real Delta lake, real GX suites, tiny real models; the runs are `genenv run
--async` as a user starts it, and the kills are SIGKILLs of its worker processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import psutil
import pytest
from conftest import ROOT, genenv_cli, genenv_inline
from demo_events import epoch_events, publish
from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from lake import SCHEMAS, Lake, LeaseHeld, read_pool, read_table, silver
from lake.lease import LEASES, Lease
from streams import HeldOffsets
from trainers import registry

# What these runs test (workers sharing and redoing work, kills, resumes, stops) does not depend on what the tiny
# models learnt: the seed tasks are valid whatever the simulator writes, so a warm start of 10 passes (not the quick
# profile's 150, most of a quick run's time) leaves every round work to do.
SEEDS_ONLY = ["--mode", "seeds-only", "--set", "warm_start_epochs=10"]


class Background:
    """`genenv ARGS` started as a user starts it, in the background. Its output (and its workers', which inherit
    the same descriptors) goes to files: a pipe that nobody reads until the end blocks every writer once 64 KiB
    are in it, and a run that blocks looks like one that is slow."""

    def __init__(self, tmp_path: Path, *args: str):
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = tmp_path / "run.out", tmp_path / "run.err"
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "engine.cli", *args], cwd=ROOT, stdout=out, stderr=err, text=True
            )

    def output(self) -> tuple[str, str]:
        """What it has printed so far, stdout and stderr."""
        return self.out_path.read_text(), self.err_path.read_text()

    def finish(self, timeout: float) -> tuple[str, str]:
        """Its output once it has exited. One still going after `timeout` seconds fails the test with every
        process's stacks (`genenv` prints them on SIGUSR1) and its output, then is killed with its workers."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            tree = [self.process.pid] + [p.pid for p in psutil.Process(self.process.pid).children(recursive=True)]
            for pid in tree:
                with contextlib.suppress(psutil.Error, ProcessLookupError):
                    if "python" in psutil.Process(pid).name():  # the broker would die of it, saying nothing
                        os.kill(pid, signal.SIGUSR1)
            time.sleep(3)
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            out, err = self.output()
            pytest.fail(
                f"`genenv {' '.join(self.process.args[3:])}` still going after {timeout:.0f} s\n{out[-3000:]}"
                f"\n{err[-20000:]}"
            )
        return self.output()


def resume(tmp_path: Path, root: Path, run_id: str, *flags: str) -> str:
    """`genenv run [FLAGS] --resume RUN_ID --lake ROOT` as a user runs it; it must succeed. Its stdout."""
    resumed = Background(tmp_path / "resume", "run", *flags, "--resume", run_id, "--lake", str(root))
    out, err = resumed.finish(timeout=420)
    assert resumed.process.returncode == 0, out[-3000:] + err[-3000:]
    return out


def of_run(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(pl.col("producer") != "warm-start")


def assert_whole(lake: Lake, group_size: int) -> None:
    """Every valid task has exactly group_size distinct rollouts, each with one reward, and one score; no checkpoint
    version is registered twice."""
    tasks = of_run(read_table(lake, silver("task"))).filter(pl.col("valid"))
    rollouts = of_run(read_table(lake, silver("rollout")))
    rewards = of_run(read_table(lake, silver("reward")))
    batches = of_run(read_table(lake, silver("batch")))
    assert tasks.height and tasks["task_id"].is_unique().all()
    assert rollouts["rollout_id"].is_unique().all() and rewards["rollout_id"].is_unique().all()
    per_task = dict(rollouts.group_by("task_id").len().iter_rows())
    assert {t: per_task.get(t, 0) for t in tasks["task_id"]} == {t: group_size for t in tasks["task_id"]}
    assert set(rewards["rollout_id"]) == set(rollouts["rollout_id"])
    scored = batches["task_ids"].explode().to_list()
    assert sorted(scored) == sorted(tasks["task_id"].to_list()), "every valid task scored exactly once"
    for kind in ("agent", "env"):
        versions = registry(lake, kind)["version"]
        assert versions.is_unique().all()


@pytest.mark.unit
def test_held_offsets_commit_below_the_first_message_whose_work_is_pending():
    class Message:
        def __init__(self, topic, partition, offset):
            self.topic, self.partition, self.offset = topic, partition, offset

    held = HeldOffsets()
    tasks, rollouts = TopicPartition("genenv.tasks", 0), TopicPartition("genenv.rollouts", 0)
    held.hold(Message("genenv.tasks", 0, 5), "t1")
    held.seen(Message("genenv.tasks", 0, 6))
    held.hold(Message("genenv.rollouts", 0, 10), "t1")
    held.hold(Message("genenv.rollouts", 0, 11), "t2")
    assert held.to_commit() == {tasks: OffsetAndMetadata(5, "", -1), rollouts: OffsetAndMetadata(10, "", -1)}
    held.committed(held.to_commit())
    assert held.to_commit() == {}, "nothing moved since"
    assert held.positions() == {tasks: 5, rollouts: 10}, "where a partition given back is read again from, moved or not"
    held.release("t1")
    assert held.to_commit() == {tasks: OffsetAndMetadata(7, "", -1), rollouts: OffsetAndMetadata(11, "", -1)}
    held.release("t2")
    assert held.to_commit()[rollouts].offset == 12
    held.forget([tasks, rollouts])
    assert held.to_commit() == {}


def task_with_rollouts(config, run_id: str):
    """One valid seed task of the config's domain, as the simulator's event, and its group_size rollouts' events."""
    import random

    from engine.coevolution import GeneratedTask, Simulator
    from engine.domains import get_domain
    from streams import RolloutCompleted

    request, text, parsed = get_domain(config.domain).seeds(random.Random(0), 1)[0]
    task = Simulator(config, get_domain(config.domain), run_id).event(
        GeneratedTask(f"{run_id}-e0-t0", f"{run_id}-e0-b0", request.prompt, text, parsed, "1", 0, [])
    )
    rollouts = [
        RolloutCompleted(
            run_id=run_id,
            epoch=0,
            rollout_id=f"{task.task_id}-r{i}",
            task_id=task.task_id,
            group_index=i,
            agent_model_version="1",
            prompt="p",
            completion=str(i),
        )
        for i in range(config.group_size)
    ]
    return task, rollouts


def wait_for(bootstrap: str, topic: str, kind: str, task_id: str, timeout_s: float = 60) -> list:
    """The events of `kind` about the task on `topic` (read from the beginning), once there is one; fails after
    timeout_s without one."""
    from streams import assigned_consumer, decode

    consumer = assigned_consumer(bootstrap, [topic])
    deadline, found = time.monotonic() + timeout_s, []
    while not found and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            events = [e for e in (decode(r.value) for r in records) if e.KIND == kind]
            found += [e for e in events if task_id in (e.task_ids if kind == "batch" else [e.task_id])]
    consumer.close()
    assert found, f"no {kind} event of the task on {topic}"
    return found


class RunningWorker:
    """A worker's `run` in a thread, stopped and joined on leaving the with block."""

    def __init__(self, worker):
        import threading

        self.worker, self.stop = worker, threading.Event()
        self.thread = threading.Thread(target=worker.run, args=(self.stop.is_set,))

    def __enter__(self):
        self.thread.start()
        return self.worker

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.mark.integration
def test_a_reward_worker_sends_again_a_task_whose_group_stays_incomplete_and_records_it(broker, lake, runner):
    """A task whose fourth rollout never comes: after reassign_after_s the reward worker sends the task again and
    publishes a TaskReassigned; the rollout made for the re-sent task completes the group, which is scored once; the
    lake holds the task once, the record, and `genenv audit task` shows it."""
    from engine.coevolution import load_config
    from engine.lineage import audit_task
    from engine.workers import RewardWorker
    from lake import ingest
    from streams import EventProducer

    config = load_config("quick", None, ["reassign_after_s=1"])
    run_id = "reassign"
    task, rollouts = task_with_rollouts(config, run_id)
    producer = EventProducer(broker.bootstrap)
    producer.publish([task, *rollouts[:-1]])
    try:
        with RunningWorker(RewardWorker(config, lake, broker.bootstrap, run_id)):
            reassigned = wait_for(broker.bootstrap, "genenv.reassignments", "reassign", task.task_id)
            assert (reassigned[0].reassignment, reassigned[0].rollouts_missing) == (1, 1)
            sent = wait_for(broker.bootstrap, "genenv.tasks", "task", task.task_id)
            assert len(sent) >= 2, "the task is sent again for its rollouts"
            producer.publish(rollouts[-1:])  # what a rollout worker makes for the re-sent task
            wait_for(broker.bootstrap, "genenv.batches", "batch", task.task_id)
    finally:
        producer.close()
    ingest(lake, broker.bootstrap, idle_exit_s=1.5, runner=runner)
    assert read_table(lake, silver("task"))["task_id"].to_list() == [task.task_id]
    assert read_table(lake, silver("reward")).height == config.group_size
    record = audit_task(lake, task.task_id)
    assert record["reassignments"] and record["reassignments"][0]["rollouts_missing"] == 1
    assert record["reassignments"][0]["held_s"] >= 1


@pytest.mark.integration
def test_a_reward_worker_reads_a_held_task_again_when_a_rebalance_gives_its_partition_back(broker, lake):
    """A reward worker holds a task whose group is incomplete, its group's offset committed at the task's message.
    Another member joins the group and leaves (subscribed to another topic, so the range assignment gives it none of
    the worker's partitions): each rebalance revokes the worker's partitions and gives them back, and kafka-python
    keeps a kept partition's position. The worker must read the task and its rollouts again, so that the last
    rollout, sent after the rebalance, completes the group and it is scored. (It forgot them and never read them
    again, and a round whose task is never scored waits for ever: the likely cause of an async resume that hung in
    CI with every worker polling.)"""
    import threading

    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    from engine.coevolution import load_config
    from engine.workers import RewardWorker
    from streams import EventProducer, assigned_consumer

    config = load_config("quick", None, [])
    run_id = "rebalance"
    task, rollouts = task_with_rollouts(config, run_id)
    producer = EventProducer(broker.bootstrap)
    producer.publish([task, *rollouts[:-1]])
    reader = assigned_consumer(broker.bootstrap, ["genenv.tasks"])
    deadline, records = time.monotonic() + 60, []
    while not records and time.monotonic() < deadline:
        records = [r for batch in reader.poll(timeout_ms=500).values() for r in batch]
    reader.close()
    assert records, "the task is on genenv.tasks"
    where = TopicPartition("genenv.tasks", records[0].partition)
    worker = RewardWorker(config, lake, broker.bootstrap, run_id)
    revoked = threading.Event()  # seen, not changed: the worker's own give_up runs, then this is set
    give_up = worker.give_up
    worker.give_up = lambda partitions: (give_up(partitions), partitions and revoked.set())  # joining revokes none
    other = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=worker.group_id,
        enable_auto_commit=False,
        partition_assignment_strategy=[RangePartitionAssignor],
    )
    try:
        with RunningWorker(worker):
            deadline = time.monotonic() + 120
            while other.committed(where) != records[0].offset and time.monotonic() < deadline:
                time.sleep(0.5)
            assert other.committed(where) == records[0].offset, "the worker holds the task: committed at its message"
            other.subscribe(["genenv.reassignments"])
            deadline = time.monotonic() + 120
            while not revoked.is_set() and time.monotonic() < deadline:
                other.poll(timeout_ms=500)
            assert revoked.is_set(), "the other member's joining revoked the worker's partitions"
            other.close()  # it leaves: the worker's partitions are revoked and given back again
            producer.publish(rollouts[-1:])
            wait_for(broker.bootstrap, "genenv.batches", "batch", task.task_id, timeout_s=120)
    finally:
        other.close()  # a second close does nothing
        producer.close()


def workers(run: subprocess.Popen, role: str) -> list[psutil.Process]:
    """The run's live worker processes of a role (`genenv worker ROLE`, or `genenv ingest`)."""
    found = []
    for child in psutil.Process(run.pid).children(recursive=True):
        try:
            line = child.cmdline()
        except psutil.Error:
            continue
        if "engine.cli" in line and (
            line[line.index("engine.cli") + 1 :][:2] == ["worker", role] or (role == "ingest" and "ingest" in line)
        ):
            found.append(child)
    return found


@pytest.mark.e2e
def test_workers_share_the_work_killed_ones_restart_and_a_run_whose_broker_dies_is_resumed_from_the_lake(tmp_path):
    """An async quick run with two rollout and two reward workers (one consumer group a role). The workers of each
    role are SIGKILLed in turn: the supervisor restarts them, and each restart lands in the lake. Then its embedded
    broker is SIGKILLed: the run stops with one line saying how to resume (no Kafka ERROR lines), and `genenv run
    --async --resume` (a fresh broker) completes it. Both rollout workers did work, no task lacks or repeats any
    work, the restarts are in their epoch's audit and every task's audit is whole. seeds-only with 16 tasks an
    epoch, so that every round has tasks on every partition (the tiny simulator's own tasks are mostly invalid:
    with 4 of them one worker may get them all). One run for both stories: an async run's start is most of
    either's time."""
    root = tmp_path / "lake"
    background = Background(
        tmp_path,
        "run",
        "--profile",
        "quick",
        "--async",
        "--lake",
        str(root),
        "--seed",
        "3",
        "--epochs",
        "4",  # the broker dies after the kills: the resume still has rounds to do
        *SEEDS_ONLY,
        "--set",
        "tasks_per_epoch=16",
        "--set",
        "rollout_workers=2",
        "--set",
        "reward_workers=2",
    )
    run = background.process
    killed = []
    try:
        for role in ("rollout", "reward", "ingest", "train-agent", "simulator"):
            deadline = time.monotonic() + 300
            while not workers(run, role) and run.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(4)  # into its work
            for process in workers(run, role):
                os.kill(process.pid, signal.SIGKILL)
                killed.append(role)
        assert {"rollout", "reward", "ingest", "train-agent"} <= set(killed), (killed, background.output())
        # The restarts are events: the broker dies once the lake holds them (a dead broker's log is lost).
        deadline, restarted = time.monotonic() + 120, set()
        while time.monotonic() < deadline and run.poll() is None and not set(killed) <= restarted:
            time.sleep(1)
            with contextlib.suppress(Exception):  # the table may not exist yet
                restarted = set(read_table(Lake(root, create=False), silver("restart"))["role"])
        assert run.poll() is None, "the run should still be going when its broker dies: " + background.output()[0]
        assert set(killed) <= restarted, (killed, restarted)
        brokers = [p for p in psutil.Process(run.pid).children(recursive=True) if "tansu" in (p.name() or "")]
        assert brokers, "the run should have an embedded broker"
        for broker_process in brokers:
            broker_process.kill()
        out, err = background.finish(timeout=300)  # with the resume's 420, inside the test's 900 s: a hang shows
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, out[-2000:] + err[-2000:]
    line = [text for text in err.splitlines() if "--resume" in text]
    assert line and "stopped answering" in line[0], err[-2000:]
    assert not [text for text in err.splitlines() if " kafka" in text and "ERROR" in text], err[-2000:]
    run_id = line[0].split("--resume ")[1].split()[0]

    resumed = resume(tmp_path, root, run_id, "--async")
    assert f"resuming run {run_id}" in resumed
    lake = Lake(root, create=False)
    assert_whole(lake, group_size=4)
    rollouts = of_run(read_table(lake, silver("rollout")))
    assert set(rollouts["producer"]) == {"rollout-0", "rollout-1"}, "both rollout workers did work"
    rewards = of_run(read_table(lake, silver("reward")))
    assert set(rewards["producer"]) <= {"reward-0", "reward-1"}
    restarts = read_table(lake, silver("restart"))
    assert set(killed) <= set(restarts["role"]), restarts
    assert (restarts["exit_code"] == -signal.SIGKILL).all()
    epoch = int(restarts["epoch"][0])
    audit = genenv_inline("audit", "epoch", str(epoch), "--lake", str(root), "--json")
    assert audit.returncode == 0 and "worker_restarts" in audit.stdout and restarts["worker"][0] in audit.stdout
    tasks = of_run(read_table(lake, silver("task"))).filter(pl.col("valid"))
    for task_id in tasks["task_id"].to_list()[:3]:
        audit = genenv_inline("audit", "task", task_id, "--lake", str(root), "--json")
        assert audit.returncode == 0 and len(json.loads(audit.stdout)["rollouts"]) == 4, audit.stdout[-2000:]


@pytest.mark.integration
def test_a_lease_is_taken_by_one_owner_and_a_stale_view_cannot_take_it(lake):
    from deltalake import DeltaTable

    uri = lake.uri(LEASES)
    first, second = Lease(uri, owner="first", ttl_s=60), Lease(uri, owner="second", ttl_s=60)
    stale = DeltaTable(uri)  # what the second saw before the first took it
    first.take()
    with pytest.raises(LeaseHeld, match="held by first"):
        second.take()
    with pytest.raises(LeaseHeld, match="held by first"):
        second._append(stale, time.time(), time.time() + 60)  # the commit at the version it read is refused
    first.take()  # renewing one's own lease is taking it again
    first.release()
    second.take()
    assert second.holder().owner == "second"
    second.release()
    far = Lease(uri, owner="ingest@another-host:1", ttl_s=1)  # a holder elsewhere: only its TTL frees the lake
    far.take()
    with pytest.raises(LeaseHeld, match="held by ingest@another-host:1"):
        first.take()
    time.sleep(1.1)
    first.take()


@pytest.mark.integration
def test_a_lease_kept_alive_outlasts_its_ttl_during_a_long_step_and_lapses_after(lake):
    """A step longer than the TTL (hashing a large checkpoint) keeps the lake: a thread renews the lease meanwhile."""
    uri = lake.uri(LEASES)
    holder, other = Lease(uri, owner="ingest@another-host:1", ttl_s=1.2), Lease(uri, owner="other", ttl_s=60)
    holder.take()
    with holder.kept_alive():
        time.sleep(3.0)  # 2.5 TTLs
        with pytest.raises(LeaseHeld, match="held by ingest@another-host:1"):
            other.take()
    time.sleep(1.5)  # nobody renews it now
    other.take()
    with pytest.raises(LeaseHeld, match="held by other"), holder.kept_alive():
        time.sleep(1.0)  # the renewal fails: lost, raised after the block


@pytest.mark.integration
def test_a_lease_renewed_for_days_keeps_its_table_small(lake, monkeypatch):
    """Each renewal replaces the name's row; every TIDY_EVERY commits the holder deletes what is older than
    KEEP_HOURS (here: everything replaced, every 10 commits), so the files do not grow with the run's length."""
    from lake import lease

    monkeypatch.setattr(lease, "KEEP_HOURS", 0)
    monkeypatch.setattr(lease, "TIDY_EVERY", 10)
    uri = lake.uri(LEASES)
    holder = Lease(uri, owner="long-run", ttl_s=60)
    for _ in range(60):
        holder.take()
    table = Path(uri)
    assert Lease(uri, owner="other").holder().owner == "long-run"
    assert read_table(lake, LEASES).height == 1
    assert len(list(table.glob("*.parquet"))) < 15, "replaced rows' files were not deleted"
    assert len(list((table / "_delta_log").glob("*.json"))) < 25, "old log entries were not deleted"


def settled(lake: Lake, quiet_s: float = 5.0, timeout_s: float = 120.0) -> dict[str, int]:
    """The lake's table versions once its ingestor has landed and refined all it was sent: unchanged over quiet_s,
    many of the test's 200 ms batches."""
    deadline, versions = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        now = {name: lake.version(name) for name in SCHEMAS if name != LEASES}
        if now == versions:
            return now
        versions = now
        time.sleep(quiet_s)
    raise AssertionError(f"the lake was still changing at the deadline: {versions}")


@pytest.mark.e2e
def test_a_second_ingestor_refuses_before_writing_and_takes_over_once_the_owner_is_gone(tmp_path, broker):
    """The lease names a live owner; once it is SIGKILLed, a new ingestor on this host takes over at once (the
    owner's process is gone) and lands everything exactly once."""
    root = tmp_path / "lake"
    owner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine.cli",
            "ingest",
            "--lake",
            str(root),
            "--bootstrap",
            broker.bootstrap,
            "--lease-ttl",
            "4",
            "--max-batch-ms",
            "200",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (root / LEASES).is_dir():
            time.sleep(0.5)
        lake = Lake(root, create=False)
        while time.monotonic() < deadline and Lease(lake.uri(LEASES)).holder() is None:
            time.sleep(0.5)
        first = epoch_events("run-lease", 0)
        publish(broker.bootstrap, first)
        while time.monotonic() < deadline and read_table(lake, silver("task")).height < 4:
            time.sleep(0.5)
        # The owner goes on to refine the tasks' epoch into gold after their silver rows land (a CI run once read the
        # versions in between, and blamed the refused ingestor for the owner's writes).
        before = settled(lake)
        second = genenv_cli(
            "ingest", "--lake", str(root), "--bootstrap", broker.bootstrap, "--idle-exit", "1", timeout=300
        )
        assert second.returncode == 2, second.stderr
        assert second.stderr.strip().count("\n") == 0 and "held by ingest@" in second.stderr, second.stderr
        assert {name: lake.version(name) for name in SCHEMAS if name != LEASES} == before, "the refused one wrote"
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    later = epoch_events("run-lease", 1)
    publish(broker.bootstrap, later)  # while nobody ingests
    taker = genenv_cli(
        "ingest",
        "--lake",
        str(root),
        "--bootstrap",
        broker.bootstrap,
        "--idle-exit",
        "3",
        "--lease-ttl",
        "4",
        timeout=300,
    )
    assert taker.returncode == 0, taker.stderr[-2000:]
    for kind in ("task", "rollout", "reward", "batch"):
        landed = read_table(lake, silver(kind))
        sent = [e for e in first + later if e.KIND == kind]
        assert landed.height == len(sent) and set(landed["event_id"]) == {e.event_id for e in sent}, kind


@pytest.mark.e2e
def test_a_sync_run_whose_broker_dies_says_how_to_resume_and_the_resume_finishes_it(tmp_path):
    """SIGKILL the embedded broker of a sync run just after its first GRPO checkpoint is registered: the run stops
    (exit 1) with one line that names the command to continue it, and that command (a fresh broker) finishes it:
    every epoch is in the lake, every valid task has its rollouts and one score, and the report covers every
    epoch. (The lake a killed broker leaves is the lake a killed run leaves: some of an epoch landed, the rest not;
    a resume reads only the lake.)"""
    root = tmp_path / "lake"
    background = Background(
        tmp_path,
        "run",
        "--profile",
        "quick",
        "--lake",
        str(root),
        "--seed",
        "5",
        "--epochs",
        "3",
        *SEEDS_ONLY,
    )
    run = background.process
    try:
        deadline = time.monotonic() + 600
        trained = False
        while time.monotonic() < deadline and run.poll() is None and not trained:
            time.sleep(0.5)
            try:
                rows = registry(Lake(root, create=False), "agent")
                trained = any(not json.loads(m)["warm_start"] for m in rows["metrics_json"])
            except Exception:  # noqa: BLE001 (the lake or its tables may not exist yet)
                trained = False
        assert trained and run.poll() is None, (
            f"the run should be alive with one GRPO update made: {background.output()}"
        )
        for process in psutil.Process(run.pid).children(recursive=True):
            if "tansu" in process.name():
                process.kill()
        out, err = background.finish(timeout=420)  # its next publish fails once the producer's timeout passes
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 1, out[-2000:] + err[-2000:]
    (config,) = (root / "runs").glob("*.toml")
    run_id = config.stem
    (line,) = [text for text in err.splitlines() if "error:" in text]
    assert "Kafka" in line and f"genenv run --resume {run_id} --lake {root}" in line, err[-2000:]
    resumed = resume(tmp_path, root, run_id)
    assert f"resuming run {run_id} after epoch" in resumed
    lake = Lake(root, create=False)
    assert_whole(lake, group_size=4)
    assert set(of_run(read_table(lake, silver("task")))["epoch"]) == {0, 1, 2}
    report = json.loads((root / "reports" / run_id / "metrics.json").read_text())
    assert [m["epoch"] for m in report["epochs"]] == [0, 1, 2]


@pytest.mark.e2e
def test_an_unbounded_async_run_never_trains_on_stale_rollouts_and_stops_cleanly_on_sigterm(tmp_path):
    """A genenv-mode async run without an epoch limit (every role in its own process, the simulator trained too)
    at agent.max_staleness 0, stopped by SIGTERM after its first GRPO update: it stops with its report and no
    worker left, nothing is duplicated, and each update trained on exactly its fresh rows, recomputed from the
    lake. (A run that completes its epochs is the resumed one of the workers-and-dead-broker test. The tiny
    simulator's tasks are mostly invalid and the rows sampled before an update are stale after it, so a second
    update can take minutes.)"""
    root = tmp_path / "lake"
    background = Background(
        tmp_path,
        "run",
        "--profile",
        "quick",
        "--async",
        "--lake",
        str(root),
        "--seed",
        "2",
        "--epochs",
        "0",
        "--set",
        "agent.max_staleness=0",
    )
    run = background.process
    try:
        deadline = time.monotonic() + 600
        updates = 0
        while time.monotonic() < deadline and run.poll() is None and updates < 1:
            time.sleep(1)
            try:
                rows = registry(Lake(root, create=False), "agent")
                updates = sum(not json.loads(m)["warm_start"] for m in rows["metrics_json"])
            except Exception:  # noqa: BLE001 (the lake or its tables may not exist yet)
                updates = 0
        if run.poll() is not None:
            out, err = background.output()
            pytest.fail(f"the unbounded run stopped by itself (rc {run.returncode}):\n{out[-3000:]}\n{err[-3000:]}")
        assert updates >= 1, "the unbounded run made no GRPO update"
        run.send_signal(signal.SIGTERM)
        out, err = background.finish(timeout=300)
    finally:
        if run.poll() is None:
            for process in [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]:
                process.kill()
    assert run.returncode == 0, out[-2000:] + err[-2000:]
    assert "stopping run" in out and "report:" in out
    lake = Lake(root, create=False)
    rollouts = of_run(read_table(lake, silver("rollout")))
    assert rollouts["rollout_id"].is_unique().all() and (rollouts.group_by("task_id").len()["len"] <= 4).all()
    assert of_run(read_table(lake, silver("reward")))["rollout_id"].is_unique().all()
    assert registry(lake, "agent")["version"].is_unique().all()
    assert_trained_on_fresh_rows(lake)

    def on_this_lake(process) -> bool:
        try:
            return str(root) in " ".join(process.cmdline())
        except psutil.Error:
            return False

    assert not [p for p in psutil.process_iter() if on_this_lake(p)], "every worker stopped with the run"


def assert_trained_on_fresh_rows(lake: Lake) -> None:
    """Each GRPO update of the agent (max_staleness 0) trained on exactly the rows its parent sampled, and counted the
    others as stale: recomputed from the pool at the update's version and at its parent's."""
    checkpoints = registry(lake, "agent")
    grpo = [row for row in checkpoints.iter_rows(named=True) if not json.loads(row["metrics_json"])["warm_start"]]
    assert grpo, "the agent trainer made no GRPO update"
    by_version = {row["version"]: row for row in checkpoints.iter_rows(named=True)}
    for row in grpo:
        parent = by_version[row["parent_version"]]
        now = read_pool(lake, "d_train", row["pool_version"])
        seen = read_pool(lake, "d_train", parent["pool_version"]).select("rollout_id")
        new = now.join(seen, on="rollout_id", how="anti").filter(pl.col("run_id") == row["run_id"])
        staleness = [row["parent_version"] - int(v) for v in new["agent_model_version"].to_list()]
        metrics = json.loads(row["metrics_json"])
        assert metrics["rows"] == sum(s == 0 for s in staleness), "trained on exactly the fresh rows"
        assert metrics["rows_left_out"].get("stale", 0) == sum(s > 0 for s in staleness)
        assert metrics["stale_rows"] == 0
