"""Reading Kafka without guessing when reading is done: committed-offset lag of a
consumer group, and every record of some topics from their start to their end offsets."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from agentledger.kafka import logs
from agentledger.testing.polling import wait_until


def lag(bootstrap: str, group: str, topic: str) -> int:
    """How many records of ``topic`` the group has not committed past."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "logger": logs.LIBRDKAFKA})
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        total = 0
        for tp in c.committed([TopicPartition(topic, p) for p in meta.partitions], timeout=10):
            low, high = c.get_watermark_offsets(tp, timeout=10)
            total += high - (tp.offset if tp.offset >= 0 else low)
        return total
    finally:
        c.close()


def read_to_end(bootstrap: str, topics: Sequence[str], *, timeout: float = 120,
                since: Mapping[tuple[str, int], int] | None = None) -> list[Message]:
    """Every record of ``topics`` (absent topics have none), each partition read from its
    start (or its offset in ``since``) to the end offset it had when the call began; fails
    on any consumer error."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "logger": logs.LIBRDKAFKA})
    found: list[Message] = []
    try:
        ends: dict[tuple[str, int], int] = {}
        for name in topics:
            meta = c.list_topics(name, timeout=10).topics.get(name)
            if meta is None or meta.error is not None:
                continue
            for part in meta.partitions:
                low, high = c.get_watermark_offsets(TopicPartition(name, part), timeout=10)
                if high > max(low, (since or {}).get((name, part), low)):
                    ends[(name, part)] = high
        if not ends:
            return found
        c.assign([TopicPartition(t, p, (since or {}).get((t, p), OFFSET_BEGINNING))
                  for t, p in ends])
        done: set[tuple[str, int]] = set()

        def read() -> bool:
            for msg in c.consume(500, timeout=0.5):
                if msg.error() is not None:
                    raise AssertionError(f"consumer error: {msg.error()}")
                at = (msg.topic() or "", msg.partition() or 0)
                if (msg.offset() or 0) + 1 >= ends.get(at, 0):
                    done.add(at)
                found.append(msg)
            return done >= set(ends)
        assert wait_until(read, timeout=timeout, interval=0), (
            f"not read to the end: {set(ends) - done}")
        return found
    finally:
        c.close()
