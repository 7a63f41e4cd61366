"""What a group member may commit: every offset below the first message whose work is not done yet.

A worker commits after its output is published, so a crash repeats work rather than losing it (at least
once; the repeated events carry the same ids and the lake keeps the first). A rollout worker's work for a
message is done when the poll that brought it is done. A reward worker's is not: a task is scored only when
all its rollouts have come, possibly many polls later, so the task's message and its rollouts' are *held*
until then. The committed offset of a partition is its lowest held offset, or the position after the last
message seen when nothing is held; after a restart or a rebalance the member (or the one that takes the
partition over) reads the held messages again and rebuilds what it was waiting for.

kafka-python commits offsets but keeps no notion of pending work per message; this is that bookkeeping.
"""

from __future__ import annotations

from collections import defaultdict

from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata


class HeldOffsets:
    def __init__(self) -> None:
        self._next: dict[TopicPartition, int] = {}  # the position after the last message seen
        self._held: dict[TopicPartition, dict[int, str]] = defaultdict(dict)  # offset -> the work it waits for
        self._committed: dict[TopicPartition, int] = {}

    def seen(self, message) -> None:
        tp = TopicPartition(message.topic, message.partition)
        self._next[tp] = max(self._next.get(tp, 0), message.offset + 1)

    def hold(self, message, key: str) -> None:
        """The message's work waits for `key` (a task id) to be done."""
        self.seen(message)
        self._held[TopicPartition(message.topic, message.partition)][message.offset] = key

    def release(self, key: str) -> None:
        for offsets in self._held.values():
            for offset in [o for o, k in offsets.items() if k == key]:
                del offsets[offset]

    def positions(self) -> dict[TopicPartition, int]:
        """Where each partition seen is to be read again from: its lowest held offset, else the position after the
        last message seen. A partition that a rebalance takes away and gives back keeps kafka-python's position
        (past the held messages), so the member seeks it back here, whether or not the offset moved since the
        last commit."""
        return {tp: min(self._held[tp]) if self._held.get(tp) else after for tp, after in self._next.items()}

    def to_commit(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """The offsets that moved since the last commit (call `committed` once they are)."""
        return {
            tp: OffsetAndMetadata(offset, "", -1)
            for tp, offset in self.positions().items()
            if self._committed.get(tp) != offset
        }

    def committed(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        self._committed.update({tp: meta.offset for tp, meta in offsets.items()})

    def forget(self, partitions) -> None:
        """Partitions taken away: their messages will be read again by whoever gets them."""
        for tp in partitions:
            self._next.pop(tp, None)
            self._held.pop(tp, None)
            self._committed.pop(tp, None)
