"""The batch runner on the real broker: rewinds, dead letters and commits as Kafka sees them.

Assertions hold whichever way the broker splits the records into batches: every answer is
published exactly once, every record before a retryable failure is acked once, the failing
record is redelivered until it succeeds, and the committed offsets end past every record.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import confluent_kafka

from agentledger import errors
from agentledger.kafka import batch
from agentledger.kafka import topics as kafka_topics
from agentledger.testing.kafka_read import read_to_end
from tests.helpers import Points
from tests.stack import Stack


def _topic(stack: Stack, partitions: int) -> str:
    name = f"t{uuid.uuid4().hex[:10]}.batch.v1"
    kafka_topics.ensure(stack.kafka_bootstrap, {name: partitions, name + ".answers": 1,
                                                name.removesuffix(".v1") + ".dlq.v1": 1},
                        replication=1)
    return name


def _produce(stack: Stack, topic: str, records: list[tuple[int, bytes, list[tuple[str, bytes]]]]) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": stack.kafka_bootstrap, "acks": "all"})
    for partition, value, headers in records:
        producer.produce(topic, value, b"k", partition=partition, headers=headers)
    assert producer.flush(15) == 0


def _runner(stack: Stack, topic: str, group: str, handle: Any) -> batch.BatchConsumer[dict[str, Any]]:
    connect = batch.connector(batch.consumer_config(
        stack.kafka_bootstrap, group_id=group, group_instance_id=None, session_timeout_ms=10_000,
        client_id="test-batch"), [topic])
    producer = confluent_kafka.Producer(batch.producer_config(stack.kafka_bootstrap, client_id="test-batch"))
    return batch.BatchConsumer(connect, producer, batch.Handler(
        parse=lambda m: json.loads(m.value()), handle=handle), pauses_s=(0.05,))


def _committed(stack: Stack, topic: str, group: str, partitions: int) -> list[int]:
    probe = confluent_kafka.Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": group})
    try:
        found = probe.committed([confluent_kafka.TopicPartition(topic, p) for p in range(partitions)], 15)
        return [tp.offset for tp in sorted(found, key=lambda tp: tp.partition)]
    finally:
        probe.close()


async def _drive(runner: batch.BatchConsumer[Any], done: Any, deadline_s: float = 60) -> None:
    """Steps until ``done()``: each step waits for records (at most the poll timeout)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not done():
        assert loop.time() < end, "the batches never finished"
        await runner.step()


async def test_a_retryable_record_is_redelivered_alone_and_every_answer_leaves_once(stack: Stack) -> None:
    topic, group = _topic(stack, 2), f"g-{uuid.uuid4().hex}"
    names = {0: ["a0", "a1", "a2", "a3"], 1: ["b0", "b1"]}
    _produce(stack, topic, [(p, json.dumps({"name": n}).encode(), []) for p, ns in names.items() for n in ns])
    attempts: Counter[str] = Counter()

    async def handle(item: dict[str, Any], _msg: Any) -> Sequence[batch.Output]:
        attempts[item["name"]] += 1
        if item["name"] == "a2" and attempts["a2"] == 1:
            raise errors.StorageError("the database is away, once")
        return (batch.Output(topic + ".answers", item["name"].encode()),)

    runner = _runner(stack, topic, group, handle)
    try:
        # Committed past every record: every answer was delivered before that commit.
        await _drive(runner, lambda: _committed(stack, topic, group, 2) == [4, 2])
    finally:
        await runner.close()
    assert attempts["a2"] == 2 and runner.stats.rewinds == 1
    # Acked before the failure: never handled again. a3 may have run once before the rewind.
    assert [attempts[n] for n in ("a0", "a1", "b0", "b1")] == [1, 1, 1, 1]
    answers = Counter(r.value().decode() for r in read_to_end(stack.kafka_bootstrap, [topic + ".answers"]))
    assert answers == Counter({n: 1 for ns in names.values() for n in ns})


async def test_poison_goes_to_the_dead_letter_topic_alone_and_the_partition_moves_on(
        stack: Stack, recorded: Callable[[str], Points]) -> None:
    dead_letters = recorded("dead_letters")
    topic, group = _topic(stack, 1), f"g-{uuid.uuid4().hex}"
    _produce(stack, topic, [(0, b'{"name": "ok0"}', []), (0, b"\x00{not json", []),
                            (0, b'{"name": "bad-header"}', [("traceparent", b"\xfe\xff")]),
                            (0, b'{"name": "ok3"}', [])])
    seen: list[str] = []

    async def handle(item: dict[str, Any], _msg: Any) -> Sequence[batch.Output]:
        seen.append(item["name"])
        return (batch.Output(topic + ".answers", item["name"].encode()),)

    runner = _runner(stack, topic, group, handle)
    try:
        await _drive(runner, lambda: _committed(stack, topic, group, 1) == [4])
    finally:
        await runner.close()
    assert sorted(seen) == ["ok0", "ok3"]
    dead = [json.loads(r.value()) for r in read_to_end(stack.kafka_bootstrap, [topic.removesuffix(".v1") + ".dlq.v1"])]
    assert sorted((d["offset"], d["error_code"]) for d in dead) == [(1, "poison_message"), (2, "poison_message")]
    # One count per delivered dead letter; a test topic is of no known family.
    assert dead_letters() == {(("outcome", "poison_message"), ("topic.family", "other")): 2}
