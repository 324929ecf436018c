"""Awaiting an outcome survives an answer topic whose start cannot be looked up yet (CI, stop 52).

Seen in a fresh-clone CI run: the first note of an MCP test succeeded 37 ms before the MCP
server answered ``in_progress``. The outcomes topic was created by that very outcome, and the
wait started while its partition had no leader: the start lookup raised, and the wait gave
up at once. A lookup that fails is now asked again until the wait's deadline.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest

from agentledger import client
from agentledger.contracts import admission, outcomes

ADMISSIONS, OUTCOMES = "t.agent.admissions.v1", "t.agent.outcomes.v1"
TENANT, OP = uuid.uuid4(), uuid.uuid4()


class Msg:
    def __init__(self, topic: str, value: bytes) -> None:
        self._topic, self._value = topic, value

    def topic(self) -> str:
        return self._topic

    def value(self) -> bytes:
        return self._value

    def error(self) -> None:
        return None


class LeaderlessAtFirst:
    """A consumer whose outcomes partition has no leader for its first ``failures`` lookups."""

    failures = 2

    def __init__(self, _config: dict[str, Any]) -> None:
        self.lookups = 0
        self.assigned: list[tuple[str, int]] = []
        self.queue: list[Msg] = []

    def list_topics(self, timeout: float) -> Any:
        part = {0: SimpleNamespace()}
        return SimpleNamespace(topics={ADMISSIONS: SimpleNamespace(partitions=part),
                                       OUTCOMES: SimpleNamespace(partitions=part)})

    def get_watermark_offsets(self, tp: confluent_kafka.TopicPartition, timeout: float,
                              cached: bool) -> tuple[int, int]:
        if tp.topic == OUTCOMES:
            self.lookups += 1
            if self.lookups <= self.failures:
                raise confluent_kafka.KafkaException(confluent_kafka.KafkaError(
                    confluent_kafka.KafkaError.LEADER_NOT_AVAILABLE))
        return 0, 0

    def offsets_for_times(self, wanted: list[confluent_kafka.TopicPartition],
                          timeout: float) -> list[confluent_kafka.TopicPartition]:
        return [confluent_kafka.TopicPartition(tp.topic, tp.partition, 0) for tp in wanted]

    def _take(self, tps: list[confluent_kafka.TopicPartition]) -> None:
        for tp in tps:
            self.assigned.append((tp.topic, tp.offset))
            if tp.topic == ADMISSIONS:
                self.queue.append(Msg(ADMISSIONS, admission.AdmissionResultV1(
                    tenant_id=TENANT, operation_id=OP, status="admitted",
                    state="pending", decided_at=datetime.now(UTC)).model_dump_json().encode()))
            else:
                self.queue.append(Msg(OUTCOMES, outcomes.OutcomeEventV1(
                    tenant_id=TENANT, operation_id=OP,
                    outcome=outcomes.Succeeded(receipt="note-1"),
                    recorded_at=datetime.now(UTC)).model_dump_json().encode()))

    def assign(self, tps: list[confluent_kafka.TopicPartition]) -> None:
        self._take(tps)

    def incremental_assign(self, tps: list[confluent_kafka.TopicPartition]) -> None:
        self._take(tps)

    def poll(self, _timeout: float) -> Msg | None:
        return self.queue.pop(0) if self.queue else None

    def close(self) -> None:
        pass


def test_an_outcome_topic_without_a_leader_yet_is_looked_up_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[LeaderlessAtFirst] = []

    def consumer(config: dict[str, Any]) -> LeaderlessAtFirst:
        made.append(LeaderlessAtFirst(config))
        return made[-1]

    monkeypatch.setattr(client, "Consumer", consumer)
    gateway = client.GatewayClient(token="t", kafka_bootstrap="b:9092",
                                   admissions_topic=ADMISSIONS, outcomes_topic=OUTCOMES)
    found = gateway._await(OP, None, 10.0, datetime.now(UTC), "outcome")
    assert found.outcome == outcomes.Succeeded(receipt="note-1")
    # Placed from the time lookup (offset 0), after two refused lookups: not from the start.
    assert made[0].lookups == 3 and (OUTCOMES, 0) in made[0].assigned
