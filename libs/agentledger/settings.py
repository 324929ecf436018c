"""Configuration shared by every service, read from the environment (pydantic-settings).

Each service adds its own settings class with its own prefix; the two connections below are
the same for all of them so that `. .local/env` reaches the stack from any shell.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final

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
# The operator's budgets over runs, principals and tenants (agentledger.budgets.rules); unset:
# none beyond the per-run tool-call budget.
BudgetsPath = Annotated[Path | None, Field(validation_alias="AGENTLEDGER_BUDGETS")]
# The operator's N-of-M approval rules (agentledger.approvals.quorum); unset: one approver.
ApprovalsPath = Annotated[Path | None, Field(validation_alias="AGENTLEDGER_APPROVALS")]
# Cedar answers memoised per policy set (agentledger.policy.memo), 0: off. 4,096 keeps a busy
# service's recurring (principal, resource, action) questions at ~1 KB each (~4 MB, measured);
# past a million the memory is the cost, not the decisions.
PolicyMemoSize = Annotated[
    int, Field(ge=0, le=1_000_000, validation_alias="AGENTLEDGER_POLICY_MEMO_SIZE")]


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
    profile: str | None = Field(
        default=None, description="`demo`: run on the packaged allowlist, policies and "
        "connectors when none are named; unset, a service refuses to start without them.")
    traces_url: str | None = Field(
        default=None, description="A trace UI (Jaeger) where the services' spans are: "
        "`explain` and the demo print each operation's trace link there (`make traces`).")


class PolicySources(BaseSettings):
    """Where the operator's actions and policies are (read by every process that decides)."""

    model_config = SettingsConfigDict(extra="ignore")

    allowlist: AllowlistPath = None
    policy_dir: PolicyDir = None
    budgets: BudgetsPath = None
    approvals: ApprovalsPath = None
    policy_memo_size: PolicyMemoSize = 4096


def load() -> Settings:
    """Read the settings from the environment now (not at import time)."""
    return Settings()


# The profile that lets a service run on the packaged configuration: the demo's allowlist,
# Cedar policies and CRM/billing connectors. Set by `make demo`, the test kit, the bench and
# the compose file; a real deployment names its own configuration instead.
DEMO_PROFILE: Final = "demo"
_SOURCES: Final = {"allowlist": "AGENTLEDGER_ALLOWLIST", "policies": "AGENTLEDGER_POLICY_DIR",
                   "connectors": "AGENTLEDGER_CONNECTORS"}


def missing_configuration(*, allowlist: bool = False, policies: bool = False,
                          connectors: bool = False,
                          environ: Mapping[str, str] | None = None) -> list[str]:
    """The operator configuration a service needs and the environment does not name.

    Outside ``AGENTLEDGER_PROFILE=demo``, a service that falls back to the packaged
    allowlist, policies or connectors would silently run the demo's in production (issue 38):
    it must refuse to start instead. Returns the variables to set (empty: it may start).
    """
    env = os.environ if environ is None else environ
    if env.get("AGENTLEDGER_PROFILE") == DEMO_PROFILE:
        return []
    wanted = {"allowlist": allowlist, "policies": policies, "connectors": connectors}
    return [_SOURCES[name] for name, needed in wanted.items() if needed and not env.get(
        _SOURCES[name])]


def require_configuration(service: str, *, allowlist: bool = False, policies: bool = False,
                          connectors: bool = False) -> None:
    """Stop a service that would run on the packaged (demo) configuration, in one line.

    Raises:
        SystemExit: naming what to set; no traceback.
    """
    missing = missing_configuration(allowlist=allowlist, policies=policies,
                                    connectors=connectors)
    if missing:
        raise SystemExit(
            f"agentledger {service}: {', '.join(missing)} not set; name the operator's "
            f"configuration (docs/connectors.md#3-the-configuration), or set "
            f"AGENTLEDGER_PROFILE={DEMO_PROFILE} to run the demo's")


def local_dir() -> Path:
    """Where a checkout keeps its local state: the stack's data and ``env``, built tools in
    ``bin/``, the demo's home (``AGENTLEDGER_LOCAL_DIR``, default ``<checkout>/.local``; the
    deploy/local scripts read the same variable)."""
    return Path(os.environ.get("AGENTLEDGER_LOCAL_DIR") or REPO_ROOT / ".local")


def demo_home() -> Path:
    """The demo's home: its logs, pid files, keys, state and the ``env`` of its commands
    (``AGENTLEDGER_DEMO_HOME``, default ``<local_dir>/demo``)."""
    return Path(os.environ.get("AGENTLEDGER_DEMO_HOME") or local_dir() / "demo")
