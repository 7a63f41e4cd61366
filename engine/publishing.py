"""Publishing what a trainer wrote: the CheckpointPublished event, then ingest until the registry holds it."""

from __future__ import annotations

import time

from lake import CHECKPOINTS, Ingestor, Lake
from streams import CheckpointPublished, EventProducer, ensure_topics
from trainers import CheckpointRecord


def publish_checkpoint(lake: Lake, bootstrap: str, record: CheckpointRecord, run_id: str, epoch: int,
                       timeout_s: float = 120.0) -> CheckpointPublished:
    """Send the event and ingest until its registry row lands (this process is the lake's ingestor meanwhile)."""
    event = CheckpointPublished(run_id=run_id, epoch=epoch, producer=f"trainer-{record.model_kind}", **record.event_fields())
    ensure_topics(bootstrap)
    with EventProducer(bootstrap, client_id="genenv-trainer") as producer:
        producer.send(event)
    ingestor = Ingestor(lake, bootstrap).start()
    deadline = time.monotonic() + timeout_s
    try:
        ingestor.run(stop=lambda: ingestor.stats.rows[CHECKPOINTS] >= 1 or time.monotonic() > deadline)
    finally:
        ingestor.close()
    if ingestor.stats.rows[CHECKPOINTS] < 1:
        raise TimeoutError(f"{record.model_kind} v{record.version} was published but did not reach {CHECKPOINTS} "
                           f"within {timeout_s:.0f}s (see `genenv lake status` for quarantined events)")
    return event
