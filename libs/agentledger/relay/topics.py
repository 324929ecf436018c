"""Destination topics, created explicitly with the configured partition counts.

Brokers run with ``auto.create.topics.enable=false`` (a typo must not make a topic), so the
relay creates each destination the first time a row routes to it. Creating an existing
topic is a no-op: partition counts of existing topics are never changed (that would move
keys between partitions and break per-key order).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from agentledger import errors
from agentledger.kafka import topics as kafka_topics

log = logging.getLogger(__name__)


class Topics:
    """Creates destination topics once per process.

    Args:
        admin: a Kafka admin client.
        partitions: partitions per topic family (``exec``, ``audit``, ``outcome``, ``dlq``).
        replication_factor: replicas per topic (1 on a single-node dev broker); from three
            on, each created topic also carries ``min.insync.replicas`` (a majority).
        timeout: seconds to wait for the broker to answer a creation.
    """

    def __init__(
        self,
        admin: AdminClient,
        partitions: Mapping[str, int],
        replication_factor: int,
        timeout: float,
    ) -> None:
        self._admin = admin
        self._partitions = dict(partitions)
        self._replication_factor = replication_factor
        self._timeout = timeout
        self._known: set[str] = set()

    def ensure(self, topic: str, family: str) -> None:
        """Create ``topic`` unless this process already saw it exist.

        Raises:
            BrokerUnavailable: the broker did not confirm the topic (retryable).
        """
        if topic in self._known:
            return
        # With 3+ replicas the topic carries its own min.insync.replicas (a majority).
        new = kafka_topics.new_topic(topic, self._partitions[family], self._replication_factor)
        future = self._admin.create_topics([new], request_timeout=self._timeout)[topic]
        try:
            future.result(timeout=self._timeout)
            log.info("event=relay.topic_created topic=%s family=%s", topic, family)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            exists = isinstance(error, KafkaError) and (
                error.code() == KafkaError.TOPIC_ALREADY_EXISTS
            )
            if not exists:
                raise errors.BrokerUnavailable("could not create topic", topic=topic) from exc
        except Exception as exc:  # the future's own timeout
            raise errors.BrokerUnavailable("could not create topic", topic=topic) from exc
        self._known.add(topic)
