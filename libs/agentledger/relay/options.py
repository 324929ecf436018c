"""What the streaming loop needs to know; services fill it from their settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


def _default_partitions() -> Mapping[str, int]:
    return {"exec": 6, "audit": 3, "outcome": 3, "dlq": 1}


@dataclass(frozen=True)
class RelayOptions:
    """Tunables of one relay process (see ``agentledger.services.relay.settings`` for why).

    Attributes:
        database_url: the ledger database; the slot lives in it.
        kafka_bootstrap: Kafka bootstrap servers.
        slot: logical replication slot name (one per relay deployment).
        publication: publication of the outbox tables.
        create_slot: create the slot when missing (else refuse to start).
        topic_namespace: prefix of every destination topic.
        partitions: partitions per topic family, used when the relay creates a topic.
        replication_factor: replicas per created topic.
        max_in_flight: records produced and unacknowledged before reading pauses.
        read_batch: replication messages read before acknowledgements are handled.
        sweep_batch: outbox rows deleted per sweep statement; this many acknowledged rows
            are swept at once.
        sweep_interval: longest wait, in seconds, between a record's acknowledgement and the
            sweep of its row (fewer acknowledged rows than ``sweep_batch`` wait for it).
        linger_ms: producer batching delay.
        delivery_timeout_ms: how long the producer retries a record before failing it.
        stall_timeout: seconds with records in flight and no delivery report at all before
            the producer is replaced and the session restarts.
        topic_timeout: seconds to wait for a topic creation.
        status_interval: seconds between standby status messages to the server.
        idle_wait: longest wait for WAL or acknowledgements before housekeeping.
        metrics_interval: seconds between refreshes of the WAL-retained gauge.
        shutdown_timeout: seconds a graceful stop waits for in-flight acknowledgements.
        backoff_initial: first reconnect delay, doubled per failure.
        backoff_max: longest reconnect delay.
        backstop_age: an outbox row older than this that the stream does not have in flight
            is published by the backstop scan (see ``backstop``): a few times the normal
            relay latency, so a healthy stream never meets it.
        backstop_interval: pause between two passes of the backstop scan.
        trace_acks: log every acknowledged record's event id, topic, partition and offset
            (tests: a record missing later explains itself).
        visibility_timeout: longest wait for a streamed transaction to become visible to
            other sessions (a commit waiting for a synchronous standby) before the session
            fails closed and restarts from the slot.
    """

    database_url: str
    kafka_bootstrap: str
    slot: str = "agentledger_relay"
    publication: str = "agentledger_outbox"
    create_slot: bool = True
    topic_namespace: str = ""
    partitions: Mapping[str, int] = field(default_factory=_default_partitions)
    replication_factor: int = 1
    max_in_flight: int = 10_000
    read_batch: int = 500
    sweep_batch: int = 500
    sweep_interval: float = 0.1
    linger_ms: int = 2
    delivery_timeout_ms: int = 120_000
    stall_timeout: float = 30.0
    topic_timeout: float = 15.0
    status_interval: float = 5.0
    idle_wait: float = 0.5
    metrics_interval: float = 5.0
    shutdown_timeout: float = 10.0
    backoff_initial: float = 0.2
    backoff_max: float = 5.0
    visibility_timeout: float = 30.0
    backstop_age: float = 10.0
    backstop_interval: float = 5.0
    trace_acks: bool = False
