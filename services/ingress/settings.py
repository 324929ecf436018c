"""Ingress settings (env prefix ``AGENTLEDGER_INGRESS_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentledger import identity
from agentledger import settings as shared
from agentledger.contracts import topics


class IngressSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_INGRESS_", extra="ignore")

    kafka_bootstrap: str = Field(validation_alias="AGENTLEDGER_KAFKA_BOOTSTRAP")
    # Replicas of the topics this service creates (AGENTLEDGER_KAFKA_REPLICATION_FACTOR).
    kafka_replication_factor: shared.KafkaReplicationFactor = 1
    # Optional: ingress' own login (role agentledger_ingress: one function, no table). With it
    # a keyed resubmission whose content differs from the command its operation id already
    # holds is answered 409 at once; without it (or when the ledger does not answer within
    # `conflict_check_timeout_s`) it is accepted and admission answers `conflict`, as before.
    database_url: str | None = Field(default=None, validation_alias="AGENTLEDGER_DATABASE_URL")
    conflict_check_timeout_s: float = Field(default=1.0, gt=0, le=10)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # The identity provider's public keys as JSON {kid: PEM}; several allow key rotation.
    session_keys: dict[str, str]
    session_issuer: str
    session_audience: str = "agentledger-ingress"
    # Ingress' own Ed25519 private key (PKCS#8 PEM) signing identity envelopes, and its kid.
    envelope_key: SecretStr
    envelope_kid: str = "ingress-1"
    envelope_ttl_s: int = Field(default=identity.ENVELOPE_TTL_S, ge=10, le=3600)
    # Far above a legitimate body (a goal is ≤ 2,000 chars, arguments ≤ 32 KiB); anything
    # bigger is refused with 413 before it is parsed.
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, le=1024 * 1024)
    # A publish not acknowledged by all in-sync replicas within this time answers 503; the
    # gateway retries with the same Idempotency-Key, hence the same operation id.
    publish_timeout_s: float = 10.0
    # Overridable so isolated environments (tests, staging tenants) can share one cluster.
    requests_topic: str = topics.REQUESTS
    proposals_topic: str = topics.PROPOSALS
    gateway_proposals_topic: str = topics.GATEWAY_PROPOSALS
    group_id: str = "agentledger-ingress"
    # Same sizing as the other agent topics: bounds planner/admission parallelism.
    partitions: int = 6
