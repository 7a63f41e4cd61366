"""Benchmark: the ingest rate on a clean log, on the same log with 10% malformed records mixed in, and against raw
kafka-python consume + JSON decode, all in the same run.

    .venv/bin/python tests/bench/ingest.py [--events 100000] [--malformed 0.1]

Prints JSON: the rates (records/s), their ratios, and each ingestor's peak RSS, for three logs: clean, with 10%
malformed records of ordinary size, and the same with oversized strings among them (which multiply the bytes).
Each ingest runs in a child process (the same code as `genenv ingest`) on its own fresh broker, so its peak RSS
is its own (VmHWM); raw consume + decode runs in this process against each log, so the bytes a log carries
show apart from what the ingestor does with them. The malformed records are the hostile-producer
classes of tests/test_fuzz_ingest.py, drawn with a fixed seed: not JSON, bit flips, truncation, wrong types,
deep nesting, lone surrogates, integers beyond int64, NaN, unknown fields, forged ids, 300k-character strings,
redeliveries and conflicting duplicates.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # peak_rss


def clean_events(n: int) -> list:
    from demo_events import epoch_events

    events, epoch = [], 0
    while len(events) < n:
        events += epoch_events(run_id="bench", epoch=epoch, tasks=64, group=8, seed=epoch)
        epoch += 1
    return events[:n]


def malformed(event, rng: random.Random, oversized: bool) -> bytes:
    """One hostile or careless copy of a valid event, from 12 classes of ordinary size, plus (`oversized`) a 13th:
    a 300k-character string, which alone multiplies the log's bytes by ~5."""
    raw = event.to_json()
    payload = json.loads(raw)
    kind = rng.randrange(13 if oversized else 12)
    if kind == 0:
        return b"{not json" + raw[: rng.randrange(len(raw))]
    if kind == 1:
        flipped = bytearray(raw)
        flipped[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return bytes(flipped)
    if kind == 2:
        return raw[: rng.randrange(1, len(raw))]
    if kind == 3:
        return json.dumps({**payload, "epoch": rng.choice(["0", True, None, [1]])}).encode()
    if kind == 4:
        depth = rng.randrange(500, 5000)
        return raw[:-1] + b',"deep":' + b"[" * depth + b"]" * depth + b"}"
    if kind == 5:
        return json.dumps({**payload, "run_id": payload["run_id"] + "\ud800"}).encode()
    if kind == 6:
        return json.dumps({**payload, "epoch": 2**64}).encode()
    if kind == 7:
        return raw.replace(b'"produced_at":0.0', b'"produced_at":NaN')
    if kind == 8:
        return json.dumps({**payload, "unknown": 1}).encode()
    if kind == 9:
        return json.dumps({**payload, "event_id": f"{rng.getrandbits(128):032x}"}).encode()
    if kind == 10:
        return raw  # a redelivery
    if kind == 11:
        return json.dumps({**payload, "producer": "someone-else"}).encode()  # a conflicting duplicate
    return json.dumps({**payload, "producer": "x" * 300_000}).encode()


def produce(bootstrap: str, events: list, share: float, oversized: bool = False, seed: int = 0) -> int:
    """The events in order, each followed, with probability `share`, by a malformed copy on its partition."""
    from streams import EventProducer

    rng = random.Random(seed)
    sent = 0
    with EventProducer(bootstrap, client_id="bench") as producer:
        for event in events:
            producer.send(event)
            sent += 1
            if rng.random() < share / (1 - share):  # so that `share` of all records are malformed
                producer.send_raw(event.TOPIC, malformed(event, rng, oversized), key=event.key.encode())
                sent += 1
    return sent


def raw_consume(bootstrap: str, n: int, strict: bool = True) -> float:
    """Records/s of kafka-python consume + json.loads alone (`strict=False`: values that do not parse count too)."""
    from streams import ALL_TOPICS, assigned_consumer

    consumer = assigned_consumer(bootstrap, ALL_TOPICS, client_id="bench-raw")
    seen, start = 0, time.perf_counter()
    while seen < n:
        for messages in consumer.poll(timeout_ms=1000).values():
            for message in messages:
                try:
                    json.loads(message.value)
                except (ValueError, RecursionError):
                    if strict:
                        raise
                seen += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    return n / elapsed


def ingest_worker(bootstrap: str, lake_path: str, n: int) -> None:
    """Child process: time the full ingest (decode, validate, bronze, silver, gold) of n records."""
    from lake import IngestConfig, Ingestor, Lake
    from lake.expectations import SuiteRunner

    runner = SuiteRunner()  # library imports and GX context are start-up, not ingest
    lake = Lake(lake_path)
    start = time.perf_counter()
    ingestor = Ingestor(lake, bootstrap, IngestConfig(max_wait_s=5), runner=runner)
    # Until every record has been through a refine step; rows still waiting for a task that never comes (a
    # malformed copy's task id) are left to their --max-wait, which is a policy, not processing time.
    ingestor.run(stop=lambda: ingestor.stats.records >= n)
    elapsed = time.perf_counter() - start
    ingestor.close()
    print(
        json.dumps(
            {
                "elapsed_s": elapsed,
                "rate": n / elapsed,
                "steps": ingestor.stats.steps,
                "waiting_for_their_task": len(ingestor.refiner.state.pending),
                "seconds": ingestor.stats.summary()["seconds"],
            }
        )
    )


def timed_ingest(bootstrap: str, lake: str, n: int) -> dict:
    """Run the ingest child; its result and its own peak RSS (tests/peak_rss.py says why not ru_maxrss)."""
    from peak_rss import wait_with_peak_rss

    with tempfile.TemporaryFile() as out:
        child = subprocess.Popen([sys.executable, __file__, "--worker", bootstrap, lake, str(n)], stdout=out)
        returncode, peak_rss = wait_with_peak_rss(child)
        if returncode != 0:
            raise SystemExit(f"the ingest child failed with {returncode}")
        out.seek(0)
        result = json.loads(out.read().decode().strip().splitlines()[-1])
    return {**result, "peak_rss_mib": round(peak_rss / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--malformed", type=float, default=0.1, help="Share of malformed records in the mixed logs.")
    parser.add_argument("--worker", nargs=3, metavar=("BOOTSTRAP", "LAKE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        ingest_worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return

    import logging

    logging.getLogger("kafka").setLevel(logging.ERROR)
    from streams import LocalBroker, ensure_topics

    events = clean_events(args.events)
    with tempfile.TemporaryDirectory() as tmp:
        with LocalBroker() as broker:
            ensure_topics(broker.bootstrap)
            t0 = time.perf_counter()
            n_clean = produce(broker.bootstrap, events, 0.0)
            produce_s = time.perf_counter() - t0
            raw_rate = raw_consume(broker.bootstrap, n_clean)
            clean = timed_ingest(broker.bootstrap, f"{tmp}/clean", n_clean)
        mixed = {}
        for name, oversized in (("malformed_mixed_in", False), ("malformed_with_oversized_strings", True)):
            with LocalBroker() as broker:
                ensure_topics(broker.bootstrap)
                n = produce(broker.bootstrap, events, args.malformed, oversized)
                raw_mixed_rate = raw_consume(broker.bootstrap, n, strict=False)
                result = timed_ingest(broker.bootstrap, f"{tmp}/{name}", n)
            mixed[name] = {
                "records": n,
                "malformed_share": round(1 - len(events) / n, 3),
                "rate": round(result["rate"], 1),
                "ratio_to_clean": round(result["rate"] / clean["rate"], 3),
                "raw_consume_decode_rate": round(raw_mixed_rate, 1),
                "raw_ratio_to_clean_raw": round(raw_mixed_rate / raw_rate, 3),
                "waiting_for_their_task_at_the_end": result["waiting_for_their_task"],
                "steps": result["steps"],
                "seconds_by_phase": result["seconds"],
                "peak_rss_mib": result["peak_rss_mib"],
            }
    print(
        json.dumps(
            {
                "events": len(events),
                "produce_rate": round(n_clean / produce_s, 1),
                "raw_consume_decode_rate": round(raw_rate, 1),
                "clean": {
                    "records": n_clean,
                    "rate": round(clean["rate"], 1),
                    "steps": clean["steps"],
                    "seconds_by_phase": clean["seconds"],
                    "peak_rss_mib": clean["peak_rss_mib"],
                },
                **mixed,
                "ratio_clean_to_raw": round(clean["rate"] / raw_rate, 3),
                "ratio_malformed_to_clean": mixed["malformed_mixed_in"]["ratio_to_clean"],
                "targets": {
                    "ratio_clean_to_raw": ">= 0.5",
                    "ratio_malformed_to_clean": ">= 0.8",
                    "peak_rss_mib": "<= 1024",
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
