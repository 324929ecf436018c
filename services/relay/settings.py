"""Configuration of the relay, read from ``AGENTLEDGER_RELAY_*`` environment variables.

The database and broker come from the shared ``AGENTLEDGER_DATABASE_URL`` and
``AGENTLEDGER_KAFKA_BOOTSTRAP`` (:mod:`agentledger.settings`). Production connects with a
LOGIN user granted ``agentledger_relay`` (REPLICATION, SELECT+DELETE on the outboxes).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentledger import settings as shared
from agentledger.relay import options


class Settings(BaseSettings):
    """Tunables of the relay; each says why it has its default."""

    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_RELAY_", extra="ignore")

    # One slot per relay deployment: two relays on one slot would fight over its position.
    slot: str = Field(default="agentledger_relay", pattern=r"^[a-z0-9_]{1,63}$")
    # Created by migration 0002; the relay checks it and never changes it.
    publication: str = "agentledger_outbox"
    # On by default so a fresh install works; operators who manage slots turn it off, and
    # then a missing slot stops the relay instead of silently skipping past lost changes.
    create_slot: bool = True
    # Empty in production; lets several environments (or test runs) share one cluster.
    topic_namespace: str = Field(default="", pattern=r"^[A-Za-z0-9._-]*$")
    # Sized for executor parallelism per connector: one consumer per partition at most.
    exec_partitions: int = Field(default=6, ge=1, le=1000)
    # Audit and outcomes are keyed by tenant; a few partitions keep analytics consumers busy.
    audit_partitions: int = Field(default=3, ge=1, le=1000)
    outcome_partitions: int = Field(default=3, ge=1, le=1000)
    # The dead-letter topic is rare and read by people: one partition keeps it in order.
    dlq_partitions: int = Field(default=1, ge=1, le=100)
    # Unset: the shared AGENTLEDGER_KAFKA_REPLICATION_FACTOR every service creates topics
    # with (1 on a single-node dev broker; 3 in production so acks=all survives a broker loss).
    replication_factor: int | None = Field(default=None, ge=1, le=5)
    # Caps memory and the size of a replay after a crash; reading pauses at the cap.
    max_in_flight: int = Field(default=10_000, ge=1)
    # Bounds how long acknowledgements wait while a burst of WAL is read.
    read_batch: int = Field(default=500, ge=1)
    # One DELETE per batch: large enough to amortise the round trip, small enough to keep
    # the sweep transaction short.
    sweep_batch: int = Field(default=500, ge=1, le=10_000)
    # Acknowledged rows are swept together: at sweep_batch rows or this long after the first
    # acknowledgement waiting, not one DELETE per acknowledged transaction (issue 41).
    sweep_interval: float = Field(default=0.1, gt=0, le=10)
    # A couple of ms batches bursts without adding visible commit→ack lag.
    linger_ms: int = Field(default=2, ge=0, le=1000)
    # Longer than a broker restart; after it a record fails and the session replays from
    # the slot instead of waiting forever.
    delivery_timeout_ms: int = Field(default=120_000, ge=1000)
    # No report at all for this long while records are in flight: the producer is stuck
    # (it happens after a broker restart), so it is replaced and the session replays.
    # Longer than a healthy broker's worst ack time, much shorter than the timeout above.
    stall_timeout: float = Field(default=30.0, gt=0)
    # A topic creation waits at most this long before the session retries.
    topic_timeout: float = Field(default=15.0, gt=0)
    # Well under wal_sender_timeout (60 s) so the server never drops a healthy relay.
    status_interval: float = Field(default=5.0, gt=0)
    # Housekeeping (metrics, keepalives) runs at least this often when nothing arrives.
    idle_wait: float = Field(default=0.5, gt=0)
    # WAL-retained gauge refresh: one cheap catalog query every few seconds.
    metrics_interval: float = Field(default=5.0, gt=0)
    # A SIGTERM waits this long for acknowledgements so a rolling restart replays little.
    shutdown_timeout: float = Field(default=10.0, ge=0)
    # Reconnect quickly after a blip, but do not hammer a database that is restarting.
    backoff_initial: float = Field(default=0.2, gt=0)
    backoff_max: float = Field(default=5.0, gt=0)
    # The backstop (issue 18): an outbox row this old that the stream does not carry is
    # published from the table — the rows before the slot existed if the session that created
    # it died, a slot re-created after a failover, any row a race left. Far above the normal
    # relay latency (milliseconds), so a healthy stream never meets it; scanned only when the
    # stream has caught up, at most every `backstop_interval` seconds.
    backstop_age: float = Field(default=10.0, gt=0)
    backstop_interval: float = Field(default=5.0, gt=0)
    # Tests: one log line per acknowledged record (event id, topic, partition, offset), so a
    # record missing from its topic later can be looked up where Kafka said it was.
    trace_acks: bool = False

    def relay_options(self, common: shared.Settings) -> options.RelayOptions:
        """The library's options from these settings and the shared connections."""
        return options.RelayOptions(
            database_url=common.database_url,
            kafka_bootstrap=common.kafka_bootstrap,
            slot=self.slot,
            publication=self.publication,
            create_slot=self.create_slot,
            topic_namespace=self.topic_namespace,
            partitions={
                "exec": self.exec_partitions,
                "audit": self.audit_partitions,
                "outcome": self.outcome_partitions,
                "dlq": self.dlq_partitions,
            },
            replication_factor=self.replication_factor or common.kafka_replication_factor,
            max_in_flight=self.max_in_flight,
            read_batch=self.read_batch,
            sweep_batch=self.sweep_batch,
            sweep_interval=self.sweep_interval,
            linger_ms=self.linger_ms,
            delivery_timeout_ms=self.delivery_timeout_ms,
            stall_timeout=self.stall_timeout,
            topic_timeout=self.topic_timeout,
            status_interval=self.status_interval,
            idle_wait=self.idle_wait,
            metrics_interval=self.metrics_interval,
            shutdown_timeout=self.shutdown_timeout,
            backoff_initial=self.backoff_initial,
            backoff_max=self.backoff_max,
            backstop_age=self.backstop_age,
            backstop_interval=self.backstop_interval,
            trace_acks=self.trace_acks,
        )


def load() -> Settings:
    """Read the settings from the environment now (not at import time)."""
    return Settings()
