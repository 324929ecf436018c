"""A record missing from its topic explains itself: what is at the offset Kafka acknowledged."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests import stack as stack_mod
from tests.integration.relay import support


def test_the_report_tells_a_false_ack_a_truncation_and_a_missed_read_apart(
    stack: stack_mod.Stack, kafka_admin: AdminClient
) -> None:
    topic = f"miss-{uuid.uuid4().hex[:8]}"
    for future in kafka_admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(timeout=30)
    try:
        producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "acks": "all"})
        for key in ("k-0", "k-1"):
            producer.produce(topic, key=key.encode(), value=b"{}")
        assert producer.flush(30) == 0
        # What the relay would have logged with AGENTLEDGER_RELAY_TRACE_ACKS=true: one true
        # acknowledgement (k-1 at 1), one pointing at another record's offset (k-2 at 0), one
        # past the end of the partition (k-3 at 7), and a key never acknowledged at all.
        log = "\n".join(
            f"INFO event=relay.acked id={uuid.uuid4()} key={key} topic={topic} partition=0 "
            f"offset={offset}" for key, offset in (("k-1", 1), ("k-2", 0), ("k-3", 7)))
        verdicts = support.explain_misses(stack.kafka_bootstrap, log, ["k-1", "k-2", "k-3", "k-4"])
        assert verdicts["k-1"].endswith("there: the reader missed it"), verdicts
        assert verdicts["k-2"].endswith("holds 'k-0': a false acknowledgement"), verdicts
        assert verdicts["k-3"].endswith("past the end (2): the log was truncated"), verdicts
        assert verdicts["k-4"].startswith("never acknowledged"), verdicts
    finally:
        for future in kafka_admin.delete_topics([topic], operation_timeout=30).values():
            future.result(timeout=30)
