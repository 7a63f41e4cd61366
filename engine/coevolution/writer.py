"""The engine's way into the lake: publish events to Kafka, then ingest until they have landed.

In sync mode the engine is also the lake's ingestor, so "the epoch is in the lake" is a fact it
can wait for: `land()` returns once every record published so far has been through bronze,
validation and the pools. Being the ingestor means holding the lake's lease (lake/lease.py): a
LakeWriter on a lake another ingestor holds stops at once with LeaseHeld.
"""

from __future__ import annotations

import time

from lake import Ingestor, Lake, LeaseHeld
from streams import CheckpointPublished, Event, EventProducer, ensure_topics
from trainers import CheckpointRecord, latest_version

from .roles import checkpoint_event

REGISTER_WAIT_S = 120.0  # how long `genenv train` waits for a running ingestor to register its checkpoint


class LakeWriter:
    def __init__(self, lake: Lake, bootstrap: str, client_id: str = "genenv-engine"):
        ensure_topics(bootstrap)
        self.lake = lake
        self.ingestor = Ingestor(lake, bootstrap).start()  # first: LeaseHeld leaves nothing open
        self.producer = EventProducer(bootstrap, client_id=client_id)
        self.sent = 0
        self._start = self.ingestor.stats.records  # records refined while recovering are not ours

    def publish(self, events: list[Event]) -> None:
        self.sent += self.producer.publish(events)  # DeliveryError when any is not acknowledged

    def land(self) -> None:
        """Ingest until everything published so far is in the lake."""
        target = self._start + self.sent
        self.ingestor.run(stop=lambda: self.ingestor.stats.records >= target)

    def publish_checkpoint(self, record: CheckpointRecord, run_id: str, epoch: int) -> CheckpointPublished:
        event = checkpoint_event(record, run_id, epoch)
        self.publish([event])
        self.land()
        return event

    def close(self) -> None:
        self.producer.close()
        self.ingestor.close()

    def __enter__(self) -> LakeWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def publish_checkpoint(
    lake: Lake, bootstrap: str, record: CheckpointRecord, run_id: str, epoch: int
) -> CheckpointPublished:
    """Publish one checkpoint's event and see it registered before returning: ingested here, or, when an ingestor
    is running on the lake (it holds the lease), by that ingestor."""
    try:
        with LakeWriter(lake, bootstrap, client_id="genenv-trainer") as writer:
            return writer.publish_checkpoint(record, run_id, epoch)
    except LeaseHeld:
        pass
    event = checkpoint_event(record, run_id, epoch)
    with EventProducer(bootstrap, client_id="genenv-trainer") as producer:
        producer.publish([event])
    deadline = time.monotonic() + REGISTER_WAIT_S
    while latest_version(lake, record.model_kind) < record.version:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{record.model_kind} v{record.version} was published but the lake's ingestor did not "
                f"register it within {REGISTER_WAIT_S:.0f}s"
            )
        time.sleep(0.5)
    return event
