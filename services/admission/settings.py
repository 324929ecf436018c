"""Admission service settings (env prefix ``AGENTLEDGER_ADMISSION_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentledger import admission
from agentledger import settings as shared
from agentledger.contracts import topics


class AdmissionSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_ADMISSION_", extra="ignore")

    database_url: str = Field(validation_alias="AGENTLEDGER_DATABASE_URL")
    kafka_bootstrap: str = Field(validation_alias="AGENTLEDGER_KAFKA_BOOTSTRAP")
    # Replicas of the topics this service creates (AGENTLEDGER_KAFKA_REPLICATION_FACTOR).
    kafka_replication_factor: shared.KafkaReplicationFactor = 1
    # The role admission acts as. Production connects with a login user that is a member of
    # agentledger_admission; a shared development URL switches to it with SET ROLE.
    db_role: str | None = "agentledger_admission"
    master_key: SecretStr = Field(validation_alias="AGENTLEDGER_MASTER_KEY")
    # Ingress's public keys (kid → PEM) that sign identity envelopes (R1.1). Admission
    # refuses proposals without a valid envelope unless require_identity is off (only for
    # offline evaluation runs that bind identity themselves).
    envelope_keys: dict[str, str] = Field(default_factory=dict)
    require_identity: bool = True
    # Tool calls one request may admit (R7); 0 disables the budget.
    budget_tool_calls: int = 20
    approval_ttl_s: float = admission.DEFAULT_APPROVAL_TTL.total_seconds()
    crm_url: str = "http://127.0.0.1:8090"  # the demo connectors' URL when none are configured
    connectors: shared.ConnectorOptions = None
    # tenant id → a read-only CRM token, as JSON; resolution never needs more than read. Used
    # for every connector unless read_tokens ({connector: {tenant id: token}}) is set.
    crm_read_tokens: dict[str, str] = Field(default_factory=dict)
    read_tokens: dict[str, dict[str, str]] | None = None
    group_id: str = "agentledger-admission"
    # Static membership (a stable id per pod, e.g. the StatefulSet pod name): a restarted
    # instance takes its partitions back at once instead of waiting out a rebalance.
    group_instance_id: str | None = None
    # How long a silent member keeps its partitions; 10 s bounds the stall after a crash.
    session_timeout_ms: int = 10_000
    # Overridable so isolated environments (tests, staging tenants) can share one cluster.
    proposals_topic: str = topics.PROPOSALS
    admissions_topic: str = topics.ADMISSIONS
    # Proposal partitions bound admission parallelism across instances; 6 covers 2-3 pods.
    partitions: int = 6
    # Each proposal holds one connection for one short transaction; 10 keeps headroom
    # for the resolver latency without crowding Postgres' connection limit.
    pool_size: int = 10
    # Records taken per batch, and proposals of one batch admitted at once (each resolves
    # its target first, then waits for a pooled connection).
    batch_size: int = 500
    concurrency: int = 32
    decision_ttl_s: float = admission.DEFAULT_DECISION_TTL.total_seconds()
