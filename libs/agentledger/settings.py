"""Configuration shared by every service, read from the environment (pydantic-settings).

Each service adds its own settings class with its own prefix; the two connections below are
the same for all of them so that `. .local/env` reaches the stack from any shell.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]

# Replicas of every topic a service creates, one setting for all of them: 1 on the one-broker
# development stack, 3 on a cluster, where created topics also get min.insync.replicas 2
# (agentledger.kafka.topics) so an acks=all write survives the loss of one broker.
KafkaReplicationFactor = Annotated[
    int, Field(ge=1, le=5, validation_alias="AGENTLEDGER_KAFKA_REPLICATION_FACTOR")]

# The connectors a deployment uses and their options, {name: {option: value}} as JSON in
# AGENTLEDGER_CONNECTORS (agentledger.connectors.plugins); unset: the demo's CRM and billing.
ConnectorOptions = Annotated[
    dict[str, dict[str, Any]] | None, Field(validation_alias="AGENTLEDGER_CONNECTORS")]
# The operator's allowlist file and Cedar policy directory; unset: the packaged ones (the demo's).
AllowlistPath = Annotated[Path | None, Field(validation_alias="AGENTLEDGER_ALLOWLIST")]
PolicyDir = Annotated[Path | None, Field(validation_alias="AGENTLEDGER_POLICY_DIR")]


class Settings(BaseSettings):
    """Connections and paths common to all agentledger processes."""

    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_", extra="ignore")

    # Unset, the local stack's: deploy/local starts it on AGENTLEDGER_PG_PORT and
    # AGENTLEDGER_KAFKA_PORT (non-default ports, so a developer's own servers never collide).
    database_url: str = Field(
        default_factory=lambda: "postgresql://agentledger:agentledger@127.0.0.1:"
        f"{os.environ.get('AGENTLEDGER_PG_PORT') or 55432}/agentledger",
        description="PostgreSQL URL of the ledger (owner role: migrations, admin tools).",
    )
    kafka_bootstrap: str = Field(
        default_factory=lambda: f"127.0.0.1:{os.environ.get('AGENTLEDGER_KAFKA_PORT') or 19092}",
        description="Kafka bootstrap servers.")
    kafka_replication_factor: KafkaReplicationFactor = 1
    migrations_dir: Path = Field(default=REPO_ROOT / "migrations")
    traces_url: str | None = Field(
        default=None, description="A trace UI (Jaeger) where the services' spans are: "
        "`explain` and the demo print each operation's trace link there (`make traces`).")


class PolicySources(BaseSettings):
    """Where the operator's actions and policies are (read by every process that decides)."""

    model_config = SettingsConfigDict(extra="ignore")

    allowlist: AllowlistPath = None
    policy_dir: PolicyDir = None


def load() -> Settings:
    """Read the settings from the environment now (not at import time)."""
    return Settings()


def local_dir() -> Path:
    """Where a checkout keeps its local state: the stack's data and ``env``, built tools in
    ``bin/``, the demo's home (``AGENTLEDGER_LOCAL_DIR``, default ``<checkout>/.local``; the
    deploy/local scripts read the same variable)."""
    return Path(os.environ.get("AGENTLEDGER_LOCAL_DIR") or REPO_ROOT / ".local")


def demo_home() -> Path:
    """The demo's home: its logs, pid files, keys, state and the ``env`` of its commands
    (``AGENTLEDGER_DEMO_HOME``, default ``<local_dir>/demo``)."""
    return Path(os.environ.get("AGENTLEDGER_DEMO_HOME") or local_dir() / "demo")
