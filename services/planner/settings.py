"""Planner settings (env prefix ``AGENTLEDGER_PLANNER_``).

The planner holds a READ-only CRM token per tenant and model credentials; no database URL,
no write scope (R1.7).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentledger import settings as shared
from agentledger.contracts import topics
from agentledger.planning import adapters


class PlannerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_PLANNER_", extra="ignore")

    kafka_bootstrap: str = Field(validation_alias="AGENTLEDGER_KAFKA_BOOTSTRAP")
    # Replicas of the topics this service creates (AGENTLEDGER_KAFKA_REPLICATION_FACTOR).
    kafka_replication_factor: shared.KafkaReplicationFactor = 1
    # Ingress' envelope public keys as JSON {kid: PEM}: a request is planned only for the
    # tenant and principal ingress signed.
    envelope_keys: dict[str, str]
    crm_url: str = "http://127.0.0.1:8090"
    # tenant id → a READ-only CRM token, as JSON.
    crm_read_tokens: dict[str, str] = Field(default_factory=dict)
    read_tokens: dict[str, dict[str, str]] | None = None  # {connector: {tenant id: token}}
    connectors: shared.ConnectorOptions = None
    # The connector whose retriever reads the evidence the model plans on.
    retriever: str = "crm"
    adapter: Literal["rules", "openai", "scripted"] = "rules"
    openai_base_url: str = "http://127.0.0.1:11434/v1"
    openai_model: str = "gpt-4o-mini"
    openai_api_key: SecretStr | None = None
    model_timeout_s: float = adapters.MODEL_TIMEOUT_S
    script_path: Path | None = None
    allowlist_path: Path | None = None
    group_id: str = "agentledger-planner"
    # Overridable so isolated environments (tests, staging tenants) can share one cluster.
    requests_topic: str = topics.REQUESTS
    proposals_topic: str = topics.PROPOSALS
    # Refusals answer the gateway here, as `rejected` admission results with the reason.
    admissions_topic: str = topics.ADMISSIONS
    # The ledger, reached ONLY as role agentledger_planner: it may execute the budget
    # functions and nothing else. Unset: model calls run unbudgeted (offline use only).
    database_url: str | None = None
    db_role: str = "agentledger_planner"
    # Tokens reserved before each model call: the most one plan may cost (R7.2).
    tokens_per_call: int = 4_000
    # Same sizing as the other agent topics.
    partitions: int = 6
