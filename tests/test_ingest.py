"""The data plane against a real broker, real Delta tables and real Great Expectations suites."""

from __future__ import annotations

import dataclasses
import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from conftest import ROOT
from demo_events import epoch_events, publish

from engine.lineage import audit_epoch
from lake import (
    CHECKPOINTS,
    D_ENV,
    D_TRAIN,
    DERIVED_TABLES,
    LATE_CHECK,
    QUARANTINE,
    VALIDATIONS,
    WEIGHTS,
    CommitRecord,
    IngestConfig,
    Ingestor,
    Lake,
    RunRows,
    checkpoint_path,
    file_sha256,
    ingest,
    quarantine_by_reason,
    read_pool,
    read_table,
    rows_appended,
    silver,
    vacuum,
    versions,
)
from lake.rebuild import record_at
from lake.tables import SCHEMAS, bronze
from streams import (
    ALL_TOPICS,
    CheckpointPublished,
    DeliveryError,
    EventProducer,
    LocalBroker,
    RewardScored,
    RolloutCompleted,
    ensure_topics,
)
from trainers.update import new_rows

FAST = IngestConfig(max_batch_ms=300, max_wait_s=2.0)


def run_ingest(lake, broker, runner, config=FAST, idle_exit_s=1.5):
    return ingest(lake, broker.bootstrap, config, idle_exit_s=idle_exit_s, runner=runner)


def event_ids(lake: Lake, kind: str) -> list[str]:
    return read_table(lake, silver(kind))["event_id"].to_list()


def comparable(frame: pl.DataFrame) -> pl.DataFrame:
    """A table's rows in a canonical order (Delta files and micro-batches may order them differently)."""
    return frame.sort(
        frame.columns[:3] + (["kafka_partition", "kafka_offset"] if "kafka_offset" in frame.columns else [])
    )


@pytest.mark.integration
def test_a_lake_fed_by_a_new_broker_takes_its_log_from_offset_zero(broker, lake, runner):
    """A fresh local broker numbers its logs from 0 again: its events must land, not be skipped as already seen."""
    first = epoch_events(run_id="first", tasks=4, group=2)
    publish(broker.bootstrap, first)
    run_ingest(lake, broker, runner)
    with LocalBroker() as second_broker:
        second = epoch_events(run_id="second", tasks=4, group=2)
        publish(second_broker.bootstrap, second)
        run_ingest(lake, second_broker, runner)
    for kind in ("task", "rollout", "reward", "batch"):
        assert sorted(event_ids(lake, kind)) == sorted(e.event_id for e in first + second if e.KIND == kind)
    assert read_table(lake, QUARANTINE).height == 0


@pytest.mark.integration
def test_a_batch_the_broker_did_not_take_is_an_error_and_lands_once_when_sent_again(lake, runner):
    """Delivery before commit: the broker stops between send and flush; publish raises DeliveryError (so a worker
    does not commit the input the batch came from), and the batch sent again, with the one before it that a
    re-reading worker produces a second time, lands in the lake once."""
    first, second = epoch_events(run_id="kept", tasks=4, group=2), epoch_events(run_id="lost", tasks=4, group=2)
    broker = LocalBroker().start()
    ensure_topics(broker.bootstrap)
    producer = None
    try:
        producer = EventProducer(broker.bootstrap, delivery_timeout_ms=3000)
        assert producer.publish(first) == len(first)
        run_ingest(lake, broker, runner)
        broker.stop()
        started = time.monotonic()
        with pytest.raises(DeliveryError, match=rf"{len(second)} of {len(second)} events not delivered"):
            producer.publish(second)
        assert time.monotonic() - started < 30  # within the delivery timeout and its one request, not minutes
    finally:
        if producer is not None:
            producer.close(timeout_s=1)
        broker.stop()
    with LocalBroker() as again:
        ensure_topics(again.bootstrap)
        with EventProducer(again.bootstrap) as producer:
            producer.publish(first + second)
        run_ingest(lake, again, runner)
    for kind in ("task", "rollout", "reward", "batch"):
        assert sorted(event_ids(lake, kind)) == sorted(e.event_id for e in first + second if e.KIND == kind)
    assert read_table(lake, QUARANTINE).height == 0


@pytest.mark.integration
def test_an_epoch_lands_in_silver_and_both_pools(broker, lake, runner):
    events = epoch_events(tasks=8, group=4)
    publish(broker.bootstrap, events)
    run_ingest(lake, broker, runner)
    for kind in ("task", "rollout", "reward", "batch"):
        assert sorted(event_ids(lake, kind)) == sorted(e.event_id for e in events if e.KIND == kind)
    d_train, d_env = read_pool(lake, "d_train"), read_pool(lake, "d_env")
    assert d_train.height == 32 and d_env.height == 8
    rewards = {e.rollout_id: e.reward for e in events if e.KIND == "reward"}
    assert dict(zip(d_train["rollout_id"], d_train["reward"])) == rewards
    batches = {t: e.p_hat for e in events if e.KIND == "batch" for t in e.task_ids}
    assert dict(zip(d_env["task_id"], d_env["p_hat"])) == batches
    assert read_table(lake, QUARANTINE).height == 0


@pytest.mark.integration
def test_a_runs_rows_are_its_rounds_each_id_once(broker, lake, runner):
    """RunRows, which the async simulator, the launcher and both resumes read: epoch 0 is scored; epoch 1 is
    rolled out but not scored, one rollout short, with one invalid task; the warm start's task and another
    run's epoch are not the run's rounds; a redelivered epoch counts once."""
    done = epoch_events("run-rows", 0)
    short = [
        e
        for e in epoch_events("run-rows", 1)
        if e.KIND != "batch" and getattr(e, "rollout_id", "") != "run-rows-e1-t0-r0"
    ]
    task = done[0]
    invalid = dataclasses.replace(
        task, epoch=1, task_id="run-rows-e1-t9", valid=False, invalid_reason="unparseable", task_prompt="", event_id=""
    )
    warm = dataclasses.replace(task, task_id="run-rows-w-t0", producer="warm-start", event_id="")
    publish(broker.bootstrap, done + short + [invalid, warm] + epoch_events("other-run", 0))
    run_ingest(lake, broker, runner)
    publish(broker.bootstrap, done)
    run_ingest(lake, broker, runner)

    run = RunRows(lake, "run-rows")
    assert run.valid_per_epoch() == {0: 4, 1: 4}
    assert run.scored_per_epoch() == {0: 4}
    assert run.tasks(valid=False).collect().height == 9
    assert sorted(run.unscored_tasks().collect()["task_id"]) == [f"run-rows-e1-t{t}" for t in range(4)]
    assert run.rollouts().collect().height == run.rewards().collect().height == 31
    assert dict(run.rollouts_per_task(["run-rows-e1-t0", "run-rows-e1-t1"]).collect().iter_rows()) == {
        "run-rows-e1-t0": 3,
        "run-rows-e1-t1": 4,
    }
    assert run.rollouts_per_task().collect().height == 8
    outcomes = run.outcomes()
    assert len(outcomes) == 31 and all(difficulty == {"digits": 2} for difficulty, _ in outcomes)
    sent = {e.rollout_id: e.success for e in done + short if e.KIND == "reward"}
    assert sum(ok for _, ok in outcomes) == sum(sent.values())


def with_id(cls, payload: dict) -> dict:
    """A payload with the event_id its (changed) identity hashes to."""
    fields = {k: v for k, v in payload.items() if k not in ("event_id", "schema")}
    return {**payload, "event_id": cls(**fields).identity_hash()}


@pytest.mark.integration
def test_bad_input_goes_to_quarantine_with_the_failed_check_and_good_events_land(broker, lake, runner):
    good = epoch_events(tasks=4, group=2)
    task = next(e for e in good if e.KIND == "task")
    reward = json.loads(next(e for e in good if e.KIND == "reward").to_json())
    rollout = json.loads(next(e for e in good if e.KIND == "rollout").to_json())
    bad = [
        ("genenv.rewards", b"{this is not json"),
        ("genenv.rewards", json.dumps({**reward, "schema": "genenv.reward/7"}).encode()),
        (
            "genenv.rewards",
            json.dumps(with_id(RewardScored, {**reward, "reward": 1.5, "rollout_id": "too-high"})).encode(),
        ),
        ("genenv.rewards", json.dumps({k: v for k, v in reward.items() if k != "task_id"}).encode()),
        (
            "genenv.rollouts",
            json.dumps(
                with_id(RolloutCompleted, {**rollout, "rollout_id": "orphan", "task_id": "never-generated"})
            ).encode(),
        ),
        ("genenv.rewards", json.dumps({**reward, "reward": "high"}).encode()),
        # unhashable values where ids belong must be reported, not crash the ingestor
        ("genenv.rewards", json.dumps({**reward, "event_id": ["a", "list"], "task_id": {"a": "dict"}}).encode()),
    ]
    with EventProducer(broker.bootstrap) as producer:
        half = len(good) // 2
        for event in good[:half]:
            producer.send(event)
        for topic, value in bad:
            producer.send_raw(topic, value, key=task.task_id.encode())
        for event in good[half:]:
            producer.send(event)
    stats = run_ingest(lake, broker, runner)

    quarantine = read_table(lake, QUARANTINE)
    reasons = quarantine["reason"].to_list()
    assert len(reasons) == len(bad)
    assert any(r.startswith("unknown_schema") and "genenv.reward/7" in r for r in reasons)
    by_check = quarantine_by_reason(lake)
    assert by_check == {
        "not_json": 1,
        "unknown_schema": 1,
        "expect_column_values_to_be_between(reward)": 1,
        "missing_field:task_id": 1,
        "expect_column_values_to_not_be_in_set(task_id)": 1,  # the orphan rollout, after its wait
        "type:reward": 1,
        "type:event_id": 1,
    }
    raw = dict(zip(quarantine["failed_checks"].list.first(), quarantine["raw"]))
    assert raw["not_json"] == b"{this is not json"
    ids = dict(zip(quarantine["failed_checks"].list.first(), quarantine["event_id"]))
    assert ids["type:reward"] == reward["event_id"]  # the ids of an event that failed its contract are kept ...
    assert ids["type:event_id"] is None  # ... where they are text
    for kind in ("task", "rollout", "reward", "batch"):
        assert sorted(event_ids(lake, kind)) == sorted(e.event_id for e in good if e.KIND == kind)
    assert stats.records == len(good) + len(bad)


@pytest.mark.integration
def test_rollout_before_its_task_waits_instead_of_failing(broker, lake, runner):
    events = epoch_events(tasks=1, group=2)
    tasks = [e for e in events if e.KIND == "task"]
    publish(broker.bootstrap, [e for e in events if e.KIND != "task"])
    ingestor = Ingestor(lake, broker.bootstrap, IngestConfig(max_batch_ms=200, max_wait_s=60), runner=runner)
    try:
        ingestor.run(idle_exit_s=0.5, stop=lambda: ingestor.stats.records >= len(events) - 1)
        assert len(ingestor.refiner.state.pending) == 4  # 2 rollouts + 2 rewards wait for the task
        assert read_table(lake, silver("rollout")).height == 0
        publish(broker.bootstrap, tasks)
        ingestor.run(stop=lambda: not ingestor.refiner.state.pending)
    finally:
        ingestor.close()
    assert read_table(lake, silver("rollout")).height == 2
    assert read_table(lake, QUARANTINE).height == 0
    assert read_pool(lake, "d_train").height == 2


@pytest.mark.integration
@pytest.mark.parametrize("restart", [False, True], ids=["same-ingestor", "after-a-restart"])
def test_a_rollout_quarantined_as_late_is_readmitted_when_its_task_lands(broker, lake, runner, restart):
    """Late is not wrong: rollouts and rewards whose wait for their task ended are quarantined for that alone, and
    land in silver and d_train when the task does, whether the same ingestor runs on or a new one starts."""
    events = epoch_events(run_id="late", tasks=1, group=2)
    tasks = [e for e in events if e.KIND == "task"]
    publish(broker.bootstrap, [e for e in events if e.KIND != "task"])
    config = IngestConfig(max_batch_ms=200, max_wait_s=0.5)
    ingestor = Ingestor(lake, broker.bootstrap, config, runner=runner)
    try:
        ingestor.run(idle_exit_s=2.0)  # the wait ends while the topics are idle
        quarantine = read_table(lake, QUARANTINE)
        assert quarantine["failed_checks"].to_list() == [[LATE_CHECK]] * 4
        assert read_table(lake, silver("rollout")).height == 0
        if restart:
            ingestor.close()
            ingestor = Ingestor(lake, broker.bootstrap, config, runner=runner)
            ingestor.run(idle_exit_s=0.5)
            assert len(ingestor.refiner.state.late) == 4  # rebuilt from the quarantine
        publish(broker.bootstrap, tasks)
        ingestor.run(idle_exit_s=5.0, stop=lambda: not ingestor.refiner.state.late)
    finally:
        ingestor.close()
    assert sorted(event_ids(lake, "rollout") + event_ids(lake, "reward")) == sorted(
        e.event_id for e in events if e.KIND in ("rollout", "reward")
    )
    assert read_pool(lake, "d_train").height == 2
    assert read_table(lake, QUARANTINE).height == 4  # the record of their lateness stays
    late = read_table(lake, VALIDATIONS).filter(pl.col("suite").str.ends_with(".late"))
    assert sorted(zip(late["suite"], late["passed"])) == [("genenv.reward.late", 2), ("genenv.rollout.late", 2)]
    assert audit_epoch(lake, 0, "late")["late_readmitted"] == 4


def redeliveries(lake: Lake) -> int:
    counts = read_table(lake, VALIDATIONS)["unexpected_counts"].to_list()
    return sum(json.loads(c).get("redelivery", 0) for c in counts)


@pytest.mark.integration
def test_a_redelivery_is_dropped_and_counted_and_a_conflicting_duplicate_quarantined(broker, lake, runner):
    events = epoch_events(tasks=1, group=1)
    task = events[0]
    later = dataclasses.replace(task, produced_at=99.0)  # the same event sent again: only the time differs
    conflicting = dataclasses.replace(task, task_prompt="What is 1 + 1?")  # same identity, so the same event_id
    assert conflicting.event_id == task.event_id
    publish(broker.bootstrap, events + [later])  # a redelivery in the same micro-batch
    stats = run_ingest(lake, broker, runner)
    assert stats.redeliveries == 1 and redeliveries(lake) == 1
    assert read_table(lake, QUARANTINE).height == 0
    publish(broker.bootstrap, [conflicting, task])  # after the original landed, in an earlier step
    run_ingest(lake, broker, runner)
    quarantine = read_table(lake, QUARANTINE)
    assert quarantine["failed_checks"].to_list() == [["conflicting_duplicate"]]
    assert quarantine["event_id"].to_list() == [task.event_id]
    assert redeliveries(lake) == 2
    tasks = read_table(lake, silver("task"))
    assert tasks["task_prompt"].to_list() == [task.task_prompt]  # the first copy stays


@pytest.mark.integration
def test_time_travel_a_pool_version_never_changes(broker, lake, runner):
    publish(broker.bootstrap, epoch_events(epoch=0, tasks=4, group=2))
    run_ingest(lake, broker, runner)
    version = lake.version(D_TRAIN)
    before = read_pool(lake, "d_train", version)
    publish(broker.bootstrap, epoch_events(epoch=1, tasks=4, group=2))
    run_ingest(lake, broker, runner)
    assert lake.version(D_TRAIN) > version
    assert read_pool(lake, "d_train").height > before.height
    assert read_pool(lake, "d_train", version).equals(before)
    assert [v.version for v in versions(lake, D_TRAIN)] == list(range(lake.version(D_TRAIN) + 1))


@pytest.mark.integration
def test_replay_from_offset_zero_rebuilds_identical_silver_and_gold_also_when_compacted(broker, lake, runner, tmp_path):
    """A second lake ingests the same log in steps of 7 records, compacting every 3 steps the tables past 2 files
    (lake/maintenance.py): every table holds the same rows as the first lake's, each compacted version is named by
    a commit record (so a restart keeps it and replay finds it), earlier versions still read as they did, and
    the Kafka offsets survive compaction (ingesting again lands nothing)."""
    publish(broker.bootstrap, epoch_events(epoch=0, tasks=6, group=3))
    run_ingest(lake, broker, runner)
    publish(broker.bootstrap, epoch_events(epoch=1, tasks=6, group=3))
    with EventProducer(broker.bootstrap) as producer:
        producer.send_raw("genenv.batches", b"garbage")
    run_ingest(lake, broker, runner)
    fresh = Lake(tmp_path / "replayed")
    steps = IngestConfig(max_batch_records=7, max_batch_ms=100, max_wait_s=2.0, compact_every=3, compact_files=2)
    first_pool = None

    def remember_the_first_pool(stats):
        nonlocal first_pool
        if first_pool is None and fresh.version(D_TRAIN) > 0:
            first_pool = (fresh.version(D_TRAIN), read_pool(fresh, "d_train", fresh.version(D_TRAIN)))

    ingest(fresh, broker.bootstrap, steps, idle_exit_s=1.5, runner=runner, on_step=remember_the_first_pool)
    for table in [silver(k) for k in ("task", "rollout", "reward", "batch", "checkpoint")] + [
        QUARANTINE,
        D_TRAIN,
        D_ENV,
    ]:
        original, replayed = comparable(read_table(lake, table)), comparable(read_table(fresh, table))
        assert original.height > 0 or table.endswith("checkpoint")
        assert original.equals(replayed), table

    maintenance = read_table(fresh, VALIDATIONS).filter(pl.col("kind") == "maintenance")
    assert maintenance.height >= 2 and (maintenance["rows"] > maintenance["passed"]).all()
    compacted = [h["version"] for h in fresh.delta(D_TRAIN).history() if h.get("operation") == "OPTIMIZE"]
    assert compacted and all(record_at(fresh, D_TRAIN, v).versions[D_TRAIN] == v for v in compacted)
    appends = [h for h in fresh.delta(D_TRAIN).history() if h.get("operation") == "WRITE"]
    assert fresh.data_files(D_TRAIN) < len(appends)  # without compaction: a file per append
    version, rows = first_pool
    assert read_pool(fresh, "d_train", version).equals(rows)  # its files are still there
    bronze_rows = {topic: read_table(fresh, bronze(topic)).height for topic in ALL_TOPICS}
    newest = {table: fresh.version(table) for table in (D_TRAIN, D_ENV, VALIDATIONS)}
    Ingestor(fresh, bootstrap="").recover()  # a restart keeps every compacted version: none is rolled back
    assert {table: fresh.version(table) for table in newest} == newest
    run_ingest(fresh, broker, runner, config=steps)
    assert {topic: read_table(fresh, bronze(topic)).height for topic in ALL_TOPICS} == bronze_rows

    # A trainer reads the rows new since its last read from the pool's change feed, across compactions: exactly
    # the rows the anti-join of the two versions gives. After a restore in the range it reads both versions again.
    newest = fresh.version(D_TRAIN)
    by_hand = read_pool(fresh, "d_train", newest).join(rows.select("rollout_id"), on="rollout_id", how="anti")
    appended = rows_appended(fresh, D_TRAIN, version, newest)
    assert appended.height == by_hand.height > 0 and appended.sort("rollout_id").equals(by_hand.sort("rollout_id"))
    assert rows_appended(fresh, D_TRAIN, newest, newest).is_empty()
    fresh.restore(D_TRAIN, newest - 1)
    assert rows_appended(fresh, D_TRAIN, version, newest + 1) is None
    assert new_rows(fresh, "d_train", newest + 1, version).height == by_hand.height - (
        read_pool(fresh, "d_train", newest).height - read_pool(fresh, "d_train", newest - 1).height
    )


@pytest.mark.integration
def test_a_vacuum_keeps_every_pool_version_a_checkpoint_read_and_deletes_the_rest(broker, lake, runner):
    """A lake ingested in small steps and compacted, with a checkpoint registered on an early pool version: a vacuum
    (retention 0, as an old lake's files would be) deletes the files of versions nothing needs (such a version no
    longer reads) but keeps the checkpoint's version, the newest and the commit record's; a trainer's read of the
    rows new since the checkpoint's version gives the same rows as before; a restart rolls nothing back."""
    publish(broker.bootstrap, epoch_events(epoch=0, tasks=6, group=3))
    publish(broker.bootstrap, epoch_events(epoch=1, tasks=6, group=3))
    steps = IngestConfig(max_batch_records=7, max_batch_ms=100, max_wait_s=2.0, compact_every=3, compact_files=2)
    run_ingest(lake, broker, runner, config=steps)
    history = {h["version"]: h.get("operation") for h in lake.delta(D_TRAIN).history()}
    newest = lake.version(D_TRAIN)
    compactions = [v for v, operation in history.items() if operation == "OPTIMIZE"]
    kept = min(v for v, operation in history.items() if operation == "WRITE" and v < max(compactions))
    gone = max(compactions) - 1  # read files that the last compaction replaced, which the kept version does not
    assert kept < gone < newest
    kept_rows, new_before = read_pool(lake, "d_train", kept), new_rows(lake, "d_train", newest, kept)
    registered = {name: None for name in SCHEMAS[CHECKPOINTS].names} | {
        "run_id": "r",
        "model_kind": "agent",
        "version": 1,
        "pool_table": D_TRAIN,
        "pool_version": kept,
    }
    lake.append(CHECKPOINTS, pa.Table.from_pylist([registered], schema=SCHEMAS[CHECKPOINTS]))
    record = CommitRecord.read(lake).versions

    assert vacuum(lake, [D_TRAIN], retain_hours=0, record_versions=record, apply=False)[D_TRAIN] > 0  # a dry run
    assert read_pool(lake, "d_train", gone).height > 0
    deleted = vacuum(lake, [bronze(t) for t in ALL_TOPICS] + list(DERIVED_TABLES), 0, record)
    assert deleted[D_TRAIN] > 0
    with pytest.raises(Exception):  # noqa: B017 (whatever the reader raises for a missing file)
        read_pool(lake, "d_train", gone)
    assert read_pool(lake, "d_train", kept).equals(kept_rows)
    assert read_pool(lake, "d_train", newest).height == kept_rows.height + new_before.height
    by_key = ["rollout_id"]
    assert new_rows(lake, "d_train", newest, kept).sort(by_key).equals(new_before.sort(by_key))
    # A restart: a vacuum's commits change no row, so nothing is rolled back (but the registry row this test wrote
    # by hand, behind the commit record's back, as a half-written step would have).
    written_by_ingest = [table for table in DERIVED_TABLES if table != CHECKPOINTS]
    versions_before = {table: lake.version(table) for table in written_by_ingest}
    Ingestor(lake, bootstrap="").recover()
    assert {table: lake.version(table) for table in written_by_ingest} == versions_before


@pytest.mark.integration
def test_a_half_written_refine_step_is_rolled_back_and_redone(broker, lake, runner):
    events = epoch_events(tasks=4, group=2)
    publish(broker.bootstrap, events)
    run_ingest(lake, broker, runner)
    # Simulate a crash after a refine step wrote silver/task but before its commit record:
    # a stray row appended behind the record's back must disappear on restart.
    stray = read_table(lake, silver("task")).head(1).with_columns(pl.lit("stray").alias("task_id"))
    lake.append(silver("task"), stray.to_arrow())
    # ... and bronze rows past the refine watermark (bronze committed, refine not) must be refined.
    extra = epoch_events(epoch=1, tasks=1, group=1)
    rows = pa.table(
        {
            "topic": ["genenv.tasks"],
            "kafka_cluster": [broker.cluster_id],
            "kafka_partition": pa.array([0], pa.int32()),
            "kafka_offset": pa.array([10_000], pa.int64()),
            "kafka_timestamp": pa.array([0], pa.int64()),
            "key": [b"k"],
            "value": [extra[0].to_json()],
            "ingested_at": pa.array([0], pa.timestamp("us", tz="UTC")),
        },
        schema=SCHEMAS[bronze("genenv.tasks")],
    )
    lake.append(bronze("genenv.tasks"), rows)
    run_ingest(lake, broker, runner)
    task_ids = read_table(lake, silver("task"))["task_id"].to_list()
    assert "stray" not in task_ids
    assert extra[0].task_id in task_ids
    assert len(task_ids) == 5


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_exactly_once_through_two_sigkills(broker, tmp_path):
    """10,000 events produced while the ingestor process is SIGKILLed twice and restarted."""
    lake_path = tmp_path / "lake"
    events = []
    epoch = 0
    while len(events) < 10_000:
        events.extend(epoch_events(run_id="kill", epoch=epoch, tasks=16, group=4, seed=epoch))
        epoch += 1
    events = events[:10_000]

    def produce():
        with EventProducer(broker.bootstrap) as producer:
            for i, event in enumerate(events):
                producer.send(event)
                if i % 200 == 199:
                    producer.flush()
                    time.sleep(0.1)  # ~2,000 events/s: production spans the kills

    def start_ingestor():
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine.cli",
                "ingest",
                "--lake",
                str(lake_path),
                "--bootstrap",
                broker.bootstrap,
                "--max-batch-records",
                "700",
                "--max-batch-ms",
                "200",
                "--max-wait",
                "20",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def bronze_rows_now() -> int:
        # Every topic, not one: on a busy machine the producer can finish before an ingestor starts and the first
        # ingestor land all of a small topic, so that the second would never grow it.
        rows = 0
        for topic in ALL_TOPICS:
            try:
                rows += len(read_table(Lake(lake_path, create=False), bronze(topic)))
            except Exception:  # the first ingestor may not have created the lake (or this table) yet
                pass
        return rows

    producer = threading.Thread(target=produce)
    producer.start()
    rng = random.Random(7)
    for _ in range(2):
        proc = start_ingestor()
        # Kill it mid-stream: once it has written something new (however slow its start on a busy machine) ...
        before, deadline = bronze_rows_now(), time.monotonic() + 300
        while before == bronze_rows_now() < len(events) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(rng.random() * 2)  # ... at a random point of a later step
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    producer.join()
    lake = Lake(lake_path)
    assert len(read_table(lake, bronze("genenv.tasks"))) > 0, "the ingestor should have made progress before the kills"
    final = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.cli",
            "ingest",
            "--lake",
            str(lake_path),
            "--bootstrap",
            broker.bootstrap,
            "--idle-exit",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert final.returncode == 0, final.stderr[-2000:]

    bronze_rows = pl.concat([read_table(lake, bronze(t)) for t in ALL_TOPICS])
    assert bronze_rows.height == 10_000
    assert bronze_rows.select(["topic", "kafka_partition", "kafka_offset"]).n_unique() == 10_000
    landed = []
    for kind in ("task", "rollout", "reward", "batch"):
        landed += event_ids(lake, kind)
    assert len(landed) == len(set(landed)) == 10_000
    assert set(landed) == {e.event_id for e in events}
    assert read_table(lake, QUARANTINE).height == 0


def checkpoint_in(lake: Lake, kind: str, version: int, weights: bytes) -> CheckpointPublished:
    """A checkpoint folder with these weights in the lake, and the event that names it truthfully."""
    folder = Path(lake.root) / checkpoint_path(kind, version)
    folder.mkdir(parents=True)
    (folder / WEIGHTS).write_bytes(weights)
    return CheckpointPublished(
        run_id="run",
        epoch=0,
        model_kind=kind,
        version=version,
        parent_version=version - 1,
        path=checkpoint_path(kind, version),
        sha256=file_sha256(folder / WEIGHTS),
        pool_table="gold/d_train",
        pool_version=1,
        config_hash="c",
        seed=0,
    )


@pytest.mark.integration
def test_the_registry_takes_only_checkpoints_whose_files_prove_them_once_per_version(broker, lake, runner):
    real = checkpoint_in(lake, "agent", 1, b"weights of agent v1")
    forged = {
        "registry_path": [
            dataclasses.replace(real, event_id="", version=2, path=p)
            for p in ("../../../../../../etc", "a\0b\0", "/etc", "checkpoints/agent/v2/../../../..")
        ],
        "registry_files": [dataclasses.replace(real, event_id="", version=3, path=checkpoint_path("agent", 3))],
        "registry_sha256": [dataclasses.replace(real, event_id="", model_kind="env", path=checkpoint_path("env", 1))],
        "registry_version_taken": [
            dataclasses.replace(real, event_id="", run_id="another-run"),
            dataclasses.replace(real, event_id="", epoch=4, sha256="0" * 64),
        ],
    }
    checkpoint_in(lake, "env", 1, b"not what the event says")
    publish(broker.bootstrap, [real] + [e for events in forged.values() for e in events])
    run_ingest(lake, broker, runner)
    registry = read_table(lake, CHECKPOINTS)
    assert registry.select("model_kind", "version", "run_id", "path").rows() == [
        ("agent", 1, "run", "checkpoints/agent/v1")
    ]
    quarantine = read_table(lake, QUARANTINE)
    by_check = quarantine_by_reason(lake)
    assert by_check == {check: len(events) for check, events in forged.items()}
    assert all(quarantine["reason"].str.len_chars() > 0)


@pytest.mark.integration
def test_a_refused_copy_does_not_take_its_event_ids_place(broker, lake, runner):
    """A forged CheckpointPublished (a path outside the lake) ahead of the real one with the same identity, in one
    micro-batch: the forgery is quarantined and the real one is registered, not refused as a duplicate."""
    real = checkpoint_in(lake, "env", 1, b"weights of env v1")
    forged = dataclasses.replace(real, path="../../../../etc")
    assert forged.event_id == real.event_id
    publish(broker.bootstrap, [forged, real])
    run_ingest(lake, broker, runner)
    assert read_table(lake, CHECKPOINTS)["path"].to_list() == ["checkpoints/env/v1"]
    assert quarantine_by_reason(lake) == {"registry_path": 1}


@pytest.mark.integration
def test_a_suite_that_cannot_be_evaluated_is_split_until_the_rows_that_break_it_are_isolated():
    """Real GX suites, with a fault injected: any frame that holds the marked task raises, as GX did on frames
    it could not evaluate. Only that row is refused (`suite_error`); the other 15 of its micro-batch land."""
    from lake.expectations import SuiteError, SuiteRunner
    from lake.refine import RawRecord, Refiner, RefineState

    class BreaksOnOneRow(SuiteRunner):
        def run(self, kind, frame, suite):
            if (frame["task_prompt"] == "poison").any():
                raise SuiteError("expect_column_values_to_be_between(epoch) could not be evaluated")
            return super().run(kind, frame, suite)

    tasks = [e for e in epoch_events(tasks=16, group=1) if e.KIND == "task"]
    tasks[11] = dataclasses.replace(tasks[11], task_prompt="poison")
    records = [RawRecord("c", "genenv.tasks", 0, i, 0, None, e.to_json()) for i, e in enumerate(tasks)]
    out = Refiner(RefineState(), BreaksOnOneRow()).refine(records, now=0.0, seq=1)
    assert [r["failed_checks"] for r in out.rows[QUARANTINE]] == [["suite_error"]]
    assert out.rows[QUARANTINE][0]["kafka_offset"] == 11
    assert out.arrow(silver("task")).num_rows == 15


@pytest.mark.integration
def test_a_lake_from_before_a_column_was_added_gains_it_and_takes_new_rows(tmp_path):
    from deltalake import DeltaTable

    old = pa.schema([f for f in SCHEMAS[silver("task")] if f.name != "offered_json"])
    DeltaTable.create(str(tmp_path / "lake" / "silver" / "task"), old)
    lake = Lake(tmp_path / "lake", create=False)
    assert "offered_json" in lake.delta(silver("task")).schema().to_arrow().names
    row = {
        "task_id": "t",
        "offered_json": "[1, 2]",
        "kafka_cluster": "c",
        "kafka_partition": 0,
        "kafka_offset": 0,
        "kafka_timestamp": 0,
    }
    lake.append(silver("task"), pa.Table.from_pylist([row], schema=SCHEMAS[silver("task")]))
    assert read_table(lake, silver("task"))["offered_json"].to_list() == ["[1, 2]"]
