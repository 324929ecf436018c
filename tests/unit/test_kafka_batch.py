"""The batch runner's bookkeeping: chains, rewinds, dead letters, commits (issue 20 §1).

The consumer and producer here are stand-ins that record what the runner asks of them: these
tests check the runner's decisions. ``tests/integration/test_kafka_batch.py`` runs the same
runner against the real broker.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
import pytest

from agentledger import errors
from agentledger.kafka import batch


@dataclass
class Msg:
    _topic: str
    _partition: int
    _offset: int
    _value: bytes | None
    _headers: list[tuple[str, bytes]] = field(default_factory=list)

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return b"k"

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    _error: confluent_kafka.KafkaError | None = None

    def error(self) -> confluent_kafka.KafkaError | None:
        return self._error


@dataclass
class Consumer:
    batches: list[list[Msg]]
    commits: list[list[tuple[str, int, int]]] = field(default_factory=list)
    seeks: list[tuple[str, int, int]] = field(default_factory=list)
    closed: bool = False

    def close(self) -> None:
        self.closed = True

    def poll(self, _timeout: float) -> Msg | None:
        if not self.batches or not self.batches[0]:
            return None
        return self.batches[0].pop(0)

    def consume(self, _n: int, _timeout: float) -> list[Msg]:
        rest, self.batches = self.batches[0], self.batches[1:]
        return rest

    def commit(self, *, offsets: list[confluent_kafka.TopicPartition], asynchronous: bool) -> None:
        assert asynchronous is False
        self.commits.append(sorted((o.topic, o.partition, o.offset) for o in offsets))

    def seek(self, tp: confluent_kafka.TopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))


@dataclass
class Producer:
    fail: bool = False
    sent: list[tuple[str, bytes]] = field(default_factory=list)
    _pending: list[Any] = field(default_factory=list)

    def produce(self, topic: str, value: bytes, key: bytes | None, *, headers: Any,
                on_delivery: Any) -> None:
        self.sent.append((topic, value))
        self._pending.append(on_delivery)

    def flush(self, _timeout: float) -> int:
        for report in self._pending:
            report("broker says no" if self.fail else None, None)
        self._pending.clear()
        return 0

    def poll(self, _timeout: float) -> int:
        return 0


def runner(consumer: Consumer, producer: Producer, handle: Any,
           chain: Any = lambda item: item.get("chain")) -> batch.BatchConsumer[dict[str, Any]]:
    return batch.BatchConsumer(
        lambda: consumer, producer,  # type: ignore[arg-type,return-value]
        batch.Handler(parse=lambda m: json.loads(m.value()), handle=handle, chain=chain),
        pauses_s=(0.0,))


def answer(item: dict[str, Any]) -> Sequence[batch.Output]:
    return (batch.Output("answers", item["name"].encode()),)


def msgs(partition: int, *items: dict[str, Any] | bytes) -> list[Msg]:
    return [Msg("t.v1", partition, i, v if isinstance(v, bytes) else json.dumps(v).encode())
            for i, v in enumerate(items)]


async def test_a_chain_runs_in_offset_order_while_other_records_run_alongside() -> None:
    order: list[str] = []
    other_started = asyncio.Event()

    async def handle(item: dict[str, Any], _msg: Any) -> Sequence[batch.Output]:
        if item["name"] == "x1":
            # Only a concurrent run of "y" can let "x1" finish.
            await asyncio.wait_for(other_started.wait(), 10)
        if item["name"] == "y":
            other_started.set()
        order.append(item["name"])
        return answer(item)

    records = msgs(0, {"name": "x1", "chain": "x"}, {"name": "x2", "chain": "x"},
                   {"name": "y"}, {"name": "x3", "chain": "x"})
    c, p = Consumer([records]), Producer()
    assert await runner(c, p, handle).step() == 4
    assert [n for n in order if n.startswith("x")] == ["x1", "x2", "x3"]
    assert order.index("y") < order.index("x1")
    assert c.commits == [[("t.v1", 0, 4)]] and c.seeks == []
    assert sorted(v for _, v in p.sent) == [b"x1", b"x2", b"x3", b"y"]


async def test_a_retryable_failure_rewinds_its_partition_from_itself_and_its_chain() -> None:
    async def handle(item: dict[str, Any], _msg: Any) -> Sequence[batch.Output]:
        if item["name"] == "a1":
            raise errors.StorageError("the database is away")
        return answer(item)

    part0 = msgs(0, {"name": "a0"}, {"name": "a1", "chain": "c"}, {"name": "a2"})
    part1 = [Msg("t.v1", 1, 7, json.dumps({"name": "b0", "chain": "c"}).encode()),
             Msg("t.v1", 1, 8, json.dumps({"name": "b1"}).encode())]
    c, p = Consumer([part0 + part1]), Producer()
    consumer = runner(c, p, handle)
    await consumer.step()
    # Partition 0 is acked up to a1 and rewound to it; a2 ran but is redelivered with it.
    # b0 waits behind a1 in their chain: partition 1 is rewound to b0 (nothing of it acked).
    assert c.commits == [[("t.v1", 0, 1), ("t.v1", 1, 7)]]
    assert sorted(c.seeks) == [("t.v1", 0, 1), ("t.v1", 1, 7)]
    # Only answers before the rewind points leave: a0. The rest are answered on redelivery.
    assert p.sent == [("answers", b"a0")]
    assert consumer.stats.rewinds == 1


async def test_poison_and_undecodable_headers_are_dead_lettered_alone() -> None:
    async def handle(item: dict[str, Any], _msg: Any) -> Sequence[batch.Output]:
        if item["name"] == "bug":
            raise KeyError("a bug in a handler")
        return answer(item)

    records = msgs(0, {"name": "ok0"}, b"{not json", {"name": "bug"}, {"name": "ok3"})
    records.append(Msg("t.v1", 0, 4, json.dumps({"name": "hdr"}).encode(), [("traceparent", b"\xff")]))
    c, p = Consumer([records]), Producer()
    consumer = runner(c, p, handle)
    await consumer.step()
    assert c.commits == [[("t.v1", 0, 5)]] and c.seeks == []
    dead = [json.loads(v) for topic, v in p.sent if topic == "t.dlq.v1"]
    assert sorted(d["offset"] for d in dead) == [1, 2, 4]
    assert {d["offset"]: d["error_code"] for d in dead}[4] == "poison_message"
    assert sorted(v for t, v in p.sent if t == "answers") == [b"ok0", b"ok3"]
    assert consumer.stats.dead_lettered == 3


async def test_an_undelivered_answer_acks_nothing_of_the_batch() -> None:
    async def handle(item: dict[str, Any], _msg: Any) -> Sequence[batch.Output]:
        return answer(item)

    records = [*msgs(0, {"name": "a"}, {"name": "b"}), Msg("t.v1", 1, 5, json.dumps({"name": "c"}).encode())]
    c, p = Consumer([records]), Producer(fail=True)
    await runner(c, p, handle).step()
    assert c.commits == [[("t.v1", 0, 0), ("t.v1", 1, 5)]]
    assert sorted(c.seeks) == [("t.v1", 0, 0), ("t.v1", 1, 5)]


async def test_the_redelivery_pause_grows_and_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    paused: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        paused.append(seconds)

    fail = {"on": True}

    async def handle(item: dict[str, Any], _msg: Any) -> Sequence[batch.Output]:
        if fail["on"]:
            raise errors.StorageError("away")
        return answer(item)

    batches = [msgs(0, {"name": "a"}) for _ in range(4)]
    c, p = Consumer(batches), Producer()
    consumer = batch.BatchConsumer(lambda: c, p, batch.Handler(  # type: ignore[arg-type,return-value]
        parse=lambda m: json.loads(m.value()), handle=handle), pauses_s=(0.1, 0.2, 0.4))
    monkeypatch.setattr(batch.asyncio, "sleep", fake_sleep)
    for _ in range(3):
        await consumer.step()
    fail["on"] = False
    await consumer.step()
    assert paused == [0.1, 0.2, 0.4]
    assert consumer._failures == 0 and c.commits[-1] == [("t.v1", 0, 1)]


async def test_a_fatal_consumer_error_replaces_the_consumer_and_acks_nothing() -> None:
    # A static member fenced by its own rejoin never consumes again (librdkafka #3437).
    fenced = Msg("t.v1", 0, 0, None)
    fenced._error = confluent_kafka.KafkaError(confluent_kafka.KafkaError.FENCED_INSTANCE_ID,
                                               "fenced", fatal=True)
    first = Consumer([[fenced, *msgs(0, {"name": "lost-with-it"})]])
    second = Consumer([msgs(0, {"name": "a"})])
    made = iter([first, second])
    p = Producer()
    consumer = batch.BatchConsumer(lambda: next(made), p, batch.Handler(  # type: ignore[arg-type,return-value]
        parse=lambda m: json.loads(m.value()), handle=lambda item, _m: _answer(item)))
    assert await consumer.step() == 0
    assert first.closed and first.commits == [] and p.sent == []
    assert await consumer.step() == 1
    assert second.commits == [[("t.v1", 0, 1)]] and p.sent == [("answers", b"a")]


async def _answer(item: dict[str, Any]) -> Sequence[batch.Output]:
    return answer(item)
