"""The broker the suite talks to is real Apache Kafka 4.x, and it round-trips records."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from agentledger.testing.polling import wait_until
from tests.stack import Stack


def test_broker_is_apache_kafka_4_in_kraft_mode(kafka_admin: AdminClient) -> None:
    cluster = kafka_admin.describe_cluster(request_timeout=10).result(timeout=15)
    broker = cluster.nodes[0]
    resource = ConfigResource(ConfigResource.Type.BROKER, str(broker.id))
    configs = kafka_admin.describe_configs([resource])[resource].result(timeout=15)

    # KRaft: the node declares its roles and there is no ZooKeeper at all.
    assert "broker" in configs["process.roles"].value
    # Kafka 4.0 removed ZooKeeper mode (KIP-833) and the message format version setting
    # (KIP-724): a 3.x broker still knows both names, a 4.x broker knows neither.
    assert "zookeeper.connect" not in configs
    assert "log.message.format.version" not in configs
    # 4.x introduced share groups (KIP-932) and their coordinator settings.
    assert any(name.startswith("share.coordinator.") for name in configs)
    # The project creates topics explicitly; a typo must never create one.
    assert configs["auto.create.topics.enable"].value == "false"


def test_idempotent_produce_and_manual_commit_round_trip(
    stack: Stack, new_topic: Callable[..., str], group_id: str
) -> None:
    topic = new_topic(partitions=3)
    producer = Producer({
        "bootstrap.servers": stack.kafka_bootstrap,
        "enable.idempotence": True,
        "acks": "all",
    })
    reports: list[tuple[str, int, int]] = []

    def on_delivery(err: KafkaError | None, msg: object) -> None:
        assert err is None, err
        reports.append((msg.key().decode(), msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    sent = {f"k{i}": uuid.uuid4().hex for i in range(30)}
    for key, value in sent.items():
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery,
                         headers=[("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")])
    assert producer.flush(30) == 0
    assert len(reports) == len(sent)

    def consumer() -> Consumer:
        return Consumer({
            "bootstrap.servers": stack.kafka_bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        })

    first = consumer()
    first.subscribe([topic])
    received: dict[str, str] = {}
    headers_seen: set[bytes] = set()

    def drain(c: Consumer) -> bool:
        msg = c.poll(0.5)
        if msg is not None and msg.error() is None:
            received[msg.key().decode()] = msg.value().decode()
            headers_seen.update(v for _, v in (msg.headers() or []))
        return len(received) == len(sent)

    assert wait_until(lambda: drain(first), timeout=60, interval=0), "records never arrived"
    assert received == sent
    assert headers_seen == {b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"}
    first.commit(asynchronous=False)
    first.close()

    # The committed offsets are what the broker holds for this group: a new member resumes there.
    second = consumer()
    committed = second.committed([TopicPartition(topic, p) for p in range(3)], timeout=15)
    end_offsets = {}
    for p in range(3):
        _, high = second.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
        end_offsets[p] = high
    assert {tp.partition: tp.offset for tp in committed} == end_offsets
    assert sum(end_offsets.values()) == len(sent)
    second.close()
