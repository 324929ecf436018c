"""Executor settings (env prefix ``AGENTLEDGER_EXECUTOR_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentledger import settings as shared
from agentledger.executor import dispatcher
from agentledger.ledger import dispatch


class ExecutorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_EXECUTOR_", extra="ignore")

    database_url: str = Field(validation_alias="AGENTLEDGER_DATABASE_URL")
    kafka_bootstrap: str = Field(validation_alias="AGENTLEDGER_KAFKA_BOOTSTRAP")
    # Replicas of the topics this service creates (AGENTLEDGER_KAFKA_REPLICATION_FACTOR).
    kafka_replication_factor: shared.KafkaReplicationFactor = 1
    master_key: SecretStr = Field(validation_alias="AGENTLEDGER_MASTER_KEY")
    # One executor deployment per connector: its own consumer group, its own credentials.
    connector: str = "crm"
    exec_topic: str | None = None  # default exec.<connector>.v1; tests use their own
    group_id: str | None = None    # default agentledger-executor-<connector>
    # Static membership (a stable id per pod, e.g. the StatefulSet pod name): a restarted
    # instance takes its partitions back at once instead of waiting out a rebalance.
    group_instance_id: str | None = None
    # How long a silent member keeps its partitions; 10 s bounds the stall after a crash.
    session_timeout_ms: int = 10_000
    db_role: str | None = "agentledger_executor"
    crm_url: str = "http://127.0.0.1:8090"  # the demo connectors' URL when none are configured
    connectors: shared.ConnectorOptions = None
    # {connector: {tenant id: write-scoped token}}: loaded only by the executor (R1.7).
    write_tokens: dict[str, dict[str, str]] = Field(default_factory=dict)
    # Default: executor-<connector>-<group_instance_id> with static membership (a stable
    # identity: its successor recovers its claims at once), else executor-<hostname>-<pid>.
    worker_id: str | None = None
    # Calls in flight per instance: ~ target throughput * provider latency. 64 covers
    # 300 commands/s at 200 ms with room, and bounds memory and CRM connections.
    max_in_flight: int = 64
    lease_s: float = dispatcher.LEASE_S
    # The longest one connector call may take, overriding the connector's own declaration
    # (the CRM's: the sum of its HTTP timeouts, 14 s). Each call renews the lease to cover it,
    # so it may exceed the lease; it may not exceed the ledger's MAX_CALL_S, the window in
    # which nobody declares an outcome for a call that may still act. Named for the
    # connector, not the service.
    call_timeout_s: float | None = Field(default=None, gt=0, le=dispatch.MAX_CALL_S,
                                         validation_alias="AGENTLEDGER_CONNECTOR_CALL_TIMEOUT_S")
    # The retry cap (ledger.dispatch.MAX_GENERATIONS): one variable for executor and reconciler,
    # which must agree on it, so it has no service prefix.
    max_generations: int = Field(default=dispatch.MAX_GENERATIONS, ge=2,
                                 validation_alias="AGENTLEDGER_MAX_GENERATIONS")
    # Graceful shutdown waits this long for in-flight calls before leaving them to the
    # reconciler; shorter than a Kubernetes termination grace period (90 s in deploy/k8s).
    drain_s: float = 45.0
    pool_size: int = 20
    partitions: int = 6
    # Records taken per batch; claims of one batch run concurrently, up to max_in_flight.
    batch_size: int = 500
