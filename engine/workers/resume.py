"""Resuming an async run (`genenv run --async --resume RUN_ID`): what the log lost is published again from the lake.

Every worker rebuilds its state from the lake and its consumer group's committed offsets, so resuming a run is
starting its workers again, minus the warm start. What differs is the broker:

- the same Kafka cluster (the lake's bronze holds records of this cluster id): the log and the groups' committed
  offsets are intact; nothing is re-published or regenerated.
- a new cluster, typically a fresh embedded broker after the last one died with the run (it keeps its log in
  memory): whatever was produced but not ingested is gone. The simulator writes again the rounds the lake
  lacks, under the same task ids; `republish` sends again, from the lake, every valid task of the run that has
  no score yet, with the rollouts the lake holds of it. The rollout workers roll out only the rollouts the lake
  lacks, the reward worker scores what is unscored, and the lake keeps the first copy of anything that
  arrives twice (same event ids).

The embedded broker's loss window is therefore everything between a producer's send and the ingestor's next
micro-batch (`--max-batch-ms`, 500 ms under `genenv run --async`), plus anything produced while the ingestor
was down; resume closes it as above.
"""

from __future__ import annotations

import polars as pl

from lake import Lake, RunRows, bronze
from streams import TOPICS, Event, EventProducer, cluster_id, event_of


def same_log(lake: Lake, bootstrap: str) -> bool:
    """The broker is the cluster the lake has been ingesting from (its log survived)."""
    clusters = lake.scan(bronze(TOPICS["task"])).select("kafka_cluster").unique().collect()["kafka_cluster"].to_list()
    return cluster_id(bootstrap) in clusters


def unfinished(lake: Lake, run_id: str) -> list[Event]:
    """The run's valid tasks without a score, each followed by the rollouts the lake holds of it."""
    run = RunRows(lake, run_id)
    tasks = run.unscored_tasks().sort("task_id").collect()
    rollouts = run.rollouts().filter(pl.col("task_id").is_in(tasks["task_id"].implode())).sort("rollout_id").collect()
    by_task: dict[str, list[dict]] = {}
    for row in rollouts.iter_rows(named=True):
        by_task.setdefault(row["task_id"], []).append(row)
    events: list[Event] = []
    for row in tasks.iter_rows(named=True):
        events.append(event_of("task", row))
        events += [event_of("rollout", r) for r in by_task.get(row["task_id"], [])]
    return events


def republish(lake: Lake, bootstrap: str, run_id: str) -> int:
    """Send the run's unfinished work again when the broker is a new cluster; how many events were sent."""
    if same_log(lake, bootstrap):
        return 0
    events = unfinished(lake, run_id)
    with EventProducer(bootstrap, client_id="genenv-resume") as producer:
        return producer.publish(events)
