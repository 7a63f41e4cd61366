"""Kafka plumbing: topic creation, an idempotent event producer, assigned and group consumers.

The ingestor assigns itself every partition: the lake, not Kafka's committed
offsets, is the source of truth for what has landed (lake/ingest.py). Workers
are group members (`group_consumer`): N workers of a role share the partitions
of its topics, and each resumes from what its group committed.

Every client takes its security settings from the environment (`security()`), so
a deployment whose cluster requires SASL or TLS (docs/EVENTS.md, "Trust") sets
them once for every genenv process.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError

from .broker import BrokerError
from .events import TOPICS, Event

log = logging.getLogger(__name__)

ALL_TOPICS: tuple[str, ...] = tuple(TOPICS.values())
DEFAULT_PARTITIONS = 3

# Environment variable -> kafka-python client option (their names, upper-cased, after GENENV_KAFKA_).
SECURITY_OPTIONS = (
    "security_protocol",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
)


def security() -> dict[str, str]:
    """kafka-python security options from GENENV_KAFKA_SECURITY_PROTOCOL, GENENV_KAFKA_SASL_MECHANISM, ... (unset:
    plaintext, as the local broker speaks)."""
    return {
        name: os.environ[f"GENENV_KAFKA_{name.upper()}"]
        for name in SECURITY_OPTIONS
        if os.environ.get(f"GENENV_KAFKA_{name.upper()}")
    }


def ensure_topics(bootstrap: str, partitions: int = DEFAULT_PARTITIONS, topics: Iterable[str] = ALL_TOPICS) -> None:
    """Create the genenv topics that do not exist yet, with GENENV_KAFKA_REPLICATION_FACTOR replicas (default 1, enough
    for one broker; a cluster's durability wants 3), and check the layout: every genenv topic is keyed by task id,
    and the reward worker needs a task's events on the same partition of each topic, so their partition counts
    must agree (TopicLayoutError otherwise). New topics take the count the existing genenv topics have (else
    `partitions`); a count other than `partitions` is only logged."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    replicas = replication_factor()
    topics = list(topics)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="genenv-admin", **security())
    try:
        existing = set(admin.list_topics())
        before = partition_counts(admin, [t for t in ALL_TOPICS if t in existing])
        # New genenv topics take the count the others already have, so that they stay co-partitioned.
        count = Counter(before.values()).most_common(1)[0][0] if before else partitions
        missing = [NewTopic(t, num_partitions=count, replication_factor=replicas) for t in topics if t not in existing]
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another worker created them first
        counts = partition_counts(admin, [t for t in ALL_TOPICS if t in existing or t in topics])
    finally:
        admin.close()
    if len(set(counts.values())) > 1:
        layout = ", ".join(f"{t} {n}" for t, n in sorted(counts.items()))
        raise TopicLayoutError(
            f"the genenv topics have different partition counts ({layout}): a task's events must share a partition "
            "number in every topic; give them one count (kafka-topics.sh --alter --partitions N on the smaller ones)"
        )
    for topic, count in counts.items():
        if count != partitions:
            log.warning("%s has %d partitions (asked for %d): the existing count is kept", topic, count, partitions)


class TopicLayoutError(BrokerError):
    """Topics whose partition counts disagree: the co-partitioning the reward worker relies on is broken."""


def replication_factor() -> int:
    """GENENV_KAFKA_REPLICATION_FACTOR, checked (default 1)."""
    raw = os.environ.get("GENENV_KAFKA_REPLICATION_FACTOR", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise BrokerError(f"GENENV_KAFKA_REPLICATION_FACTOR must be a whole number >= 1, got {raw!r}")
    return int(raw)


def partition_counts(admin: KafkaAdminClient, topics: list[str]) -> dict[str, int]:
    """Topic -> number of partitions, as the cluster's metadata gives it."""
    if not topics:
        return {}
    return {d["name"]: len(d["partitions"]) for d in admin.describe_topics(topics) if d.get("partitions")}


def cluster_id(bootstrap: str) -> str:
    """The cluster's id: offsets mean something only within one cluster."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="genenv-admin", **security())
    try:
        return admin.describe_cluster()["cluster_id"]
    finally:
        admin.close()


class DeliveryError(KafkaError):
    """Events the broker did not acknowledge. Whoever sent them must not commit the input they came from: read
    again after a restart, it is produced again, and the ingest's idempotent ids keep the lake's copy single.
    A KafkaError, so that every handler of broker failures (a worker's retry, the CLI's one line) treats it so."""


class EventProducer:
    """Publishes events as JSON, keyed by task id; idempotent with acks=all.

    `publish` is the one way to send a batch whose delivery matters: kafka-python's flush() only logs a failed
    batch, and a dropped send() future hides it, so publish looks at every future and raises DeliveryError."""

    def __init__(
        self, bootstrap: str, client_id: str = "genenv", linger_ms: int = 5, delivery_timeout_ms: int = 120_000
    ):
        self._producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            max_in_flight_requests_per_connection=5,
            delivery_timeout_ms=delivery_timeout_ms,  # a send the broker has not acknowledged by then fails
            request_timeout_ms=min(30_000, delivery_timeout_ms // 2),  # kafka-python: below delivery - linger
            **security(),
        )

    def publish(self, events: Iterable[Event], timeout_s: float | None = None) -> int:
        """Send the events and wait until the broker has acknowledged every one; the number sent. Raises
        DeliveryError (naming how many failed and the first reason) when any was not delivered."""
        futures = [self.send(event) for event in events]
        try:
            self.flush(timeout_s)
        except KafkaTimeoutError as exc:
            raise DeliveryError(f"{len(futures)} events not acknowledged within {timeout_s}s") from exc
        failed = [f for f in futures if not f.is_done or f.failed()]
        if failed:
            first = failed[0].exception if failed[0].is_done else "not acknowledged"
            raise DeliveryError(f"{len(failed)} of {len(futures)} events not delivered: {first}")
        return len(futures)

    def send(self, event: Event, topic: str | None = None):
        return self._producer.send(topic or event.TOPIC, key=event.key.encode(), value=event.to_json())

    def send_raw(self, topic: str, value: bytes, key: bytes | None = None):
        """Publish bytes as they are (tests and tools that need malformed input)."""
        return self._producer.send(topic, key=key, value=value)

    def flush(self, timeout_s: float | None = None) -> None:
        self._producer.flush(timeout=timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Deliver what is pending (waiting at most timeout_s) and disconnect."""
        self._producer.close(timeout=timeout_s)

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def partitions_of(consumer: KafkaConsumer, topic: str) -> list[TopicPartition]:
    parts = consumer.partitions_for_topic(topic) or set()
    return [TopicPartition(topic, p) for p in sorted(parts)]


def _consumer_options(bootstrap: str, client_id: str, group_id: str | None, max_poll_records: int) -> dict:
    """What every genenv consumer shares: no auto-commit (progress is committed after the work, or kept in the
    lake), the beginning of the log when nothing is committed, and the deployment's security settings."""
    return dict(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=max_poll_records,
        **security(),
    )


def assigned_consumer(
    bootstrap: str,
    topics: Iterable[str],
    client_id: str = "genenv",
    max_poll_records: int = 5000,
) -> KafkaConsumer:
    """A consumer assigned every partition of `topics`, positioned at the beginning (seek to resume elsewhere)."""
    consumer = KafkaConsumer(
        **_consumer_options(bootstrap, client_id, None, max_poll_records),
        fetch_max_bytes=16 * 1024 * 1024,  # what the consumer buffers ahead of the ingestor
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    partitions = [tp for topic in topics for tp in partitions_of(consumer, topic)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    return consumer


def group_consumer(
    bootstrap: str,
    topics: Iterable[str],
    group_id: str,
    client_id: str = "genenv",
    co_partitioned: bool = False,
    max_poll_records: int = 500,
    listener=None,
) -> KafkaConsumer:
    """A member of consumer group `group_id` subscribed to `topics`, starting from the group's committed offsets
    (a new group: from the beginning). Offsets are committed by the caller, after its work is published.
    listener: a kafka ConsumerRebalanceListener (told before partitions are taken away and after new ones come).

    co_partitioned: the member needs every event of a key from all of `topics` (the reward worker: a task and its
    rollouts, both keyed by task id, land in the same partition number of each topic). Range assignment keeps
    that, at the price of an eager rebalance (every member rejoins); otherwise the assignment is
    cooperative-sticky, so a member joining or leaving moves only the partitions that must move."""
    consumer = KafkaConsumer(
        **_consumer_options(bootstrap, client_id, group_id, max_poll_records),
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1_000,
        max_poll_interval_ms=30 * 60_000,  # a rollout batch on a CPU takes minutes; a member is not dead for that
        partition_assignment_strategy=[RangePartitionAssignor if co_partitioned else CooperativeStickyAssignor],
    )
    consumer.subscribe(list(topics), listener=listener)
    return consumer
