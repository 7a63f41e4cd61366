"""Benchmark: full ingest rate against raw kafka-python consume + JSON decode, in the same run.

    .venv/bin/python tests/bench/ingest.py [--events 100000]

Prints JSON: both rates (events/s), their ratio, and the ingestor's peak RSS.
The ingest runs in a child process (the same code as `genenv ingest`), so its
peak RSS is its own; the raw consumer runs in this process against the same
topics on the same broker.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def produce(bootstrap: str, n: int) -> int:
    from engine.demo import epoch_events, publish

    events, epoch = [], 0
    while len(events) < n:
        events += epoch_events(run_id="bench", epoch=epoch, tasks=64, group=8, seed=epoch)
        epoch += 1
    return publish(bootstrap, events[:n])


def raw_consume(bootstrap: str, n: int) -> float:
    from streams import ALL_TOPICS, assigned_consumer

    consumer = assigned_consumer(bootstrap, ALL_TOPICS, client_id="bench-raw")
    seen, start = 0, time.perf_counter()
    while seen < n:
        for messages in consumer.poll(timeout_ms=1000).values():
            for message in messages:
                json.loads(message.value)
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
    ingestor = Ingestor(lake, bootstrap, IngestConfig(), runner=runner)
    ingestor.run(stop=lambda: ingestor.stats.records >= n)
    elapsed = time.perf_counter() - start
    ingestor.close()
    print(json.dumps({"elapsed_s": elapsed, "rate": n / elapsed, "steps": ingestor.stats.steps,
                      "seconds": ingestor.stats.summary()["seconds"]}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--worker", nargs=3, metavar=("BOOTSTRAP", "LAKE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        ingest_worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return

    import logging

    logging.getLogger("kafka").setLevel(logging.ERROR)
    from streams import LocalBroker, ensure_topics

    with LocalBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        ensure_topics(broker.bootstrap)
        t0 = time.perf_counter()
        n = produce(broker.bootstrap, args.events)
        produce_s = time.perf_counter() - t0
        raw_rate = raw_consume(broker.bootstrap, n)
        child = subprocess.run([sys.executable, __file__, "--worker", broker.bootstrap, f"{tmp}/lake", str(n)],
                               capture_output=True, text=True, check=True)
        full = json.loads(child.stdout.strip().splitlines()[-1])
        peak_rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({
        "events": n,
        "produce_rate": round(n / produce_s, 1),
        "raw_consume_decode_rate": round(raw_rate, 1),
        "full_ingest_rate": round(full["rate"], 1),
        "ratio_full_to_raw": round(full["rate"] / raw_rate, 3),
        "ingest_steps": full["steps"],
        "ingest_seconds_by_phase": full["seconds"],
        "ingestor_peak_rss_mib": round(peak_rss_kib / 1024, 1),
        "targets": {"ratio_full_to_raw": ">= 0.5", "ingestor_peak_rss_mib": "<= 1024"},
    }, indent=2))


if __name__ == "__main__":
    main()
