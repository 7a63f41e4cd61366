"""Benchmark: whether an ingest step and the trainer's snapshot read stay flat as a lake's history grows, with
compaction (the default, lake/maintenance.py) and without it, in the same run.

    .venv/bin/python tests/bench/history.py [--sizes 1000 10000 100000] [--rows-per-step 256] \
        [--compact-every 100] [--compact-files 64] [--repeats 3]

The history is written by the ingestor's own step (Ingestor.step: bronze, refine with its suites, the derived
tables, the commit record, compaction every `--compact-every` steps), fed records of demo epochs straight from
memory, no broker: what grows is the lake, and Kafka is not what is measured. Steps are small, as a streaming
run's are (a step closes after a second of events), so the tables gather many small files. At each history size
(rows of gold/d_train) it times, median of `--repeats` (3): one more ingest step, and then the trainer's snapshot
read of the rows that step appended (trainers/update.py `new_rows`), through one Lake as a trainer process keeps it.
Prints JSON: the seconds per size for each series, and the ratio of the largest size's to the smallest's
(issue 28's target: within 1.5x with compaction).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # demo_events


class Log:
    """Demo epochs as the RawRecords a broker would hand the ingestor, numbered as one partition per topic."""

    def __init__(self, rows_per_step: int):
        self.tasks = max(1, rows_per_step // 8)  # G = 8 rollouts (pool rows) a task
        self.epoch = 0
        self.offsets: dict[str, int] = {}

    def step(self) -> list:
        from demo_events import epoch_events

        from lake.refine import RawRecord
        from streams.events import TOPICS

        events = epoch_events(run_id="bench", epoch=self.epoch, tasks=self.tasks, group=8, seed=self.epoch)
        self.epoch += 1
        records = []
        for event in events:
            topic = TOPICS[event.KIND]
            offset = self.offsets.get(topic, -1) + 1
            self.offsets[topic] = offset
            records.append(RawRecord("bench", topic, 0, offset, 0, event.event_id.encode(), event.to_json()))
        return records


def seconds(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def series(sizes: list[int], rows_per_step: int, compact_every: int, compact_files: int, repeats: int) -> dict:
    from lake import D_TRAIN, IngestConfig, Ingestor, Lake, read_pool
    from trainers.update import new_rows

    with tempfile.TemporaryDirectory() as folder:
        lake = Lake(Path(folder) / "lake")
        ingestor = Ingestor(
            lake, bootstrap="", config=IngestConfig(compact_every=compact_every, compact_files=compact_files)
        )
        ingestor.recover()
        log, out, steps = Log(rows_per_step), {}, 0
        for size in sorted(sizes):
            while read_pool(lake, "d_train").height < size:
                ingestor.step(log.step())
                steps += 1
            # As a trainer process reads: one Lake, whose table handle it keeps (Lake.latest), each read the rows one
            # ingest step appended since its last read. The warm-up read brings the handle to now.
            new_rows(lake, "d_train", lake.version(D_TRAIN), lake.version(D_TRAIN) - 1)
            ingests, reads = [], []
            for _ in range(repeats):
                previous = lake.version(D_TRAIN)
                ingests.append(seconds(lambda: ingestor.step(log.step())))
                reads.append(seconds(functools.partial(new_rows, lake, "d_train", lake.version(D_TRAIN), previous)))
            ingest_s, read_s = statistics.median(ingests), statistics.median(reads)
            out[size] = {
                "steps": steps,
                "files": lake.data_files(D_TRAIN),
                "ingest_step_s": round(ingest_s, 4),
                "snapshot_read_s": round(read_s, 4),
            }
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--rows-per-step", type=int, default=256)
    parser.add_argument("--compact-every", type=int, default=100)
    parser.add_argument("--compact-files", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="steps (each with its read) timed at each size")
    args = parser.parse_args()
    result = {"rows_per_step": args.rows_per_step}
    for name, every in (("compacted", args.compact_every), ("never_compacted", 0)):
        points = series(args.sizes, args.rows_per_step, every, args.compact_files, args.repeats)
        small, large = points[min(points)], points[max(points)]
        result[name] = {
            "by_history_rows": points,
            "ingest_ratio": round(large["ingest_step_s"] / small["ingest_step_s"], 2),
            "read_ratio": round(large["snapshot_read_s"] / small["snapshot_read_s"], 2),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
