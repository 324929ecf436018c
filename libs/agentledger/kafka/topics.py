"""Create the project's topics explicitly (brokers run with auto-creation off), sized for the
cluster: the replication factor comes from settings (``AGENTLEDGER_KAFKA_REPLICATION_FACTOR``)
and, from three replicas on, each topic carries its own ``min.insync.replicas``."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from agentledger.kafka import logs


def min_insync_replicas(replication: int) -> int | None:
    """The ``min.insync.replicas`` a created topic carries, or None for the broker's default.

    A majority of the replicas from three on: with ``acks=all`` a write is acknowledged only
    once that many replicas hold it, so it survives the loss of any minority, and a loss
    beyond that stops writes (NOT_ENOUGH_REPLICAS) instead of acknowledging them on one copy.
    Set on the topic, not left to the broker, whose default is 1. Below three replicas a
    majority would stop every write at the first broker loss, so the broker's default stands.
    """
    return replication // 2 + 1 if replication >= 3 else None


def new_topic(name: str, partitions: int, replication: int) -> NewTopic:
    """The creation request of one project topic (every creator of topics goes through it)."""
    floor = min_insync_replicas(replication)
    config = {"min.insync.replicas": str(floor)} if floor is not None else {}
    return NewTopic(name, num_partitions=partitions, replication_factor=replication, config=config)


def ensure(
    bootstrap: str, partitions: Mapping[str, int], *, replication: int, timeout: float = 30.0,
) -> list[str]:
    """Create the topics that do not exist yet; returns the names created now.

    Args:
        bootstrap: Kafka bootstrap servers.
        partitions: topic name → partition count.
        replication: replicas per topic (the service's ``kafka_replication_factor``).
        timeout: seconds to wait for the listing and each creation.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=logs.LIBRDKAFKA)
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = [new_topic(name, n, replication)
              for name, n in partitions.items() if name not in existing]
    if not wanted:
        return []
    created: list[str] = []
    for name, future in admin.create_topics(wanted, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":  # a concurrent creator won
                raise
    return created
