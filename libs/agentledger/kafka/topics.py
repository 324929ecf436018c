"""Create the project's topics explicitly (brokers run with auto-creation off)."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

# One node in development; production sets 3 (deploy/k8s), with min.insync.replicas=2.
DEFAULT_REPLICATION = 1


def ensure(
    bootstrap: str, partitions: Mapping[str, int], *, replication: int = DEFAULT_REPLICATION,
    timeout: float = 30.0,
) -> list[str]:
    """Create the topics that do not exist yet; returns the names created now."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = [NewTopic(name, num_partitions=n, replication_factor=replication)
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
