"""Kafka: event schemas, producer/consumer helpers and the local broker launcher."""

from .broker import BOOTSTRAP_ENV, BrokerError, LocalBroker, configured_bootstrap, kafka_bootstrap, require_broker
from .events import (
    EVENT_TYPES,
    KIND_OF_TOPIC,
    SCHEMA_VERSION,
    TOPICS,
    BatchScored,
    CheckpointPublished,
    Event,
    EventDecodeError,
    RewardScored,
    RolloutCompleted,
    TaskGenerated,
    WorkerRestarted,
    content_digest,
    decode,
    event_class,
    event_of,
    payload_of,
)
from .kafka import ALL_TOPICS, DEFAULT_PARTITIONS, EventProducer, assigned_consumer, cluster_id, ensure_topics, group_consumer
from .offsets import HeldOffsets

__all__ = [
    "ALL_TOPICS", "BOOTSTRAP_ENV", "DEFAULT_PARTITIONS", "EVENT_TYPES", "KIND_OF_TOPIC", "SCHEMA_VERSION", "TOPICS",
    "BatchScored", "BrokerError", "CheckpointPublished", "Event", "EventDecodeError", "EventProducer", "HeldOffsets", "LocalBroker",
    "RewardScored", "RolloutCompleted", "TaskGenerated", "WorkerRestarted", "assigned_consumer", "cluster_id", "configured_bootstrap", "content_digest",
    "decode", "ensure_topics", "event_class", "event_of", "group_consumer", "kafka_bootstrap", "payload_of", "require_broker",
]
