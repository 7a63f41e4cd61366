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
    content_digest,
    decode,
    event_class,
    payload_of,
)
from .kafka import ALL_TOPICS, DEFAULT_PARTITIONS, EventProducer, assigned_consumer, cluster_id, ensure_topics

__all__ = [
    "ALL_TOPICS", "BOOTSTRAP_ENV", "DEFAULT_PARTITIONS", "EVENT_TYPES", "KIND_OF_TOPIC", "SCHEMA_VERSION", "TOPICS",
    "BatchScored", "BrokerError", "CheckpointPublished", "Event", "EventDecodeError", "EventProducer", "LocalBroker",
    "RewardScored", "RolloutCompleted", "TaskGenerated", "assigned_consumer", "cluster_id", "configured_bootstrap", "content_digest",
    "decode", "ensure_topics", "event_class", "kafka_bootstrap", "payload_of", "require_broker",
]
