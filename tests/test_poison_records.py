"""The records that used to stop the ingestor for good, between two valid events, ingested twice: once
straight through, and once after the ingestor was SIGKILLed mid-batch (bronze written, refine not), so the
restart's recovery meets the poison in bronze, where every restart used to crash again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT
from demo_events import epoch_events

from lake import QUARANTINE, IngestConfig, Lake, ingest, read_table, silver
from lake.tables import bronze
from streams import EventProducer

pytestmark = pytest.mark.e2e

VALID_A, VALID_B, POISONED = [e for e in epoch_events(run_id="poison", tasks=3, group=1) if e.KIND == "task"]
BASE = json.loads(POISONED.to_json())


def spliced(field: str, literal: str) -> bytes:
    return json.dumps({**BASE, field: "\u0000MARK\u0000"}).replace(json.dumps("\u0000MARK\u0000"), literal).encode()


POISON = {  # the crash classes of the hostile-producer report, in its order
    "deep_json": [spliced("task_prompt", "[" * 600 + "]" * 600)],
    "int_beyond_int64": [spliced("epoch", "9223372036854775808")],
    "bool_in_int_field": [json.dumps({**BASE, "epoch": True}).encode()],
    "lone_surrogate": [json.dumps({**BASE, "task_prompt": "\ud800"}).encode()],
    "run_id_object_and_bool": [
        json.dumps({**BASE, "run_id": {"a": 1}}).encode(),
        json.dumps({**BASE, "run_id": False}).encode(),
    ],
}

KILLED_AFTER_BRONZE = """
import os, signal, sys
sys.path.insert(0, {root!r})
from lake import IngestConfig, Ingestor, Lake
ingestor = Ingestor(Lake({lake!r}), {bootstrap!r}, IngestConfig(max_batch_ms=2000)).start()
batch = []
while len(batch) < {records}:
    batch += ingestor.poll_batch()
ingestor.write_bronze(batch)
os.kill(os.getpid(), signal.SIGKILL)  # mid-batch: the bronze commit is done, the refine commit is not
"""


def produce(bootstrap: str, poison: list[bytes]) -> None:
    with EventProducer(bootstrap) as producer:  # one key: one partition, in this order
        producer.send(VALID_A)
        for value in poison:
            producer.send_raw(VALID_A.TOPIC, value, key=VALID_A.key.encode())
        producer.send_raw(VALID_A.TOPIC, VALID_B.to_json(), key=VALID_A.key.encode())


def assert_outcome(lake: Lake, poison: list[bytes]) -> None:
    assert sorted(read_table(lake, silver("task"))["event_id"]) == sorted([VALID_A.event_id, VALID_B.event_id])
    quarantine = read_table(lake, QUARANTINE)
    assert sorted(quarantine["raw"].to_list()) == sorted(poison)
    assert all(quarantine["reason"].str.len_chars() > 0)


def test_poison_records_are_quarantined_and_their_neighbours_land_also_after_a_sigkill(broker, tmp_path, runner):
    """Every crash class at once, between the two valid events (one ingest and one SIGKILL for all of them: each
    class in a stream of its own cost the suite four more ingestor starts and kills, and found nothing more)."""
    poison = [value for values in POISON.values() for value in values]
    produce(broker.bootstrap, poison)

    straight = Lake(tmp_path / "straight")
    stats = ingest(straight, broker.bootstrap, IngestConfig(max_batch_ms=300), idle_exit_s=1.0, runner=runner)
    assert stats.records == 2 + len(poison)
    assert_outcome(straight, poison)

    killed = tmp_path / "killed"
    Lake(killed)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_AFTER_BRONZE.format(
                root=str(ROOT), lake=str(killed), bootstrap=broker.bootstrap, records=2 + len(poison)
            ),
        ],
        timeout=300,
    )
    assert child.returncode == -9
    assert read_table(Lake(killed, create=False), bronze(VALID_A.TOPIC)).height == 2 + len(poison)
    assert read_table(Lake(killed, create=False), silver("task")).height == 0
    for _ in range(2):  # the restart recovers; a second restart finds nothing left to do
        restart = subprocess.run(
            [
                sys.executable,
                "-m",
                "engine.cli",
                "ingest",
                "--lake",
                str(killed),
                "--bootstrap",
                broker.bootstrap,
                "--idle-exit",
                "1",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert restart.returncode == 0, restart.stderr[-2000:]
        assert_outcome(Lake(killed, create=False), poison)
