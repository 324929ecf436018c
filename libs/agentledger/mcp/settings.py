"""Settings of the MCP server (env prefix ``AGENTLEDGER_MCP_``).

The broker comes from the shared ``AGENTLEDGER_KAFKA_BOOTSTRAP``; the allowlist and Cedar
policies from ``AGENTLEDGER_ALLOWLIST`` and ``AGENTLEDGER_POLICY_DIR``, like every process
that decides (:mod:`agentledger.settings`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentledger import identity
from agentledger.contracts import topics


class McpSettings(BaseSettings):
    """Tunables of ``agentledger mcp``; each says why it has its default."""

    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_MCP_", extra="ignore")

    # stdio: one agent per process (a desktop client starts it); http: a shared server.
    transport: Literal["stdio", "http"] = "stdio"
    # Proposals go through ingress only, never to Kafka or the ledger directly.
    ingress_url: str = "http://127.0.0.1:8080"
    kafka_bootstrap: str = Field(validation_alias="AGENTLEDGER_KAFKA_BOOTSTRAP")
    # Where admission answers and outcomes are read; overridable so isolated environments
    # (tests, staging tenants) can share one cluster.
    admissions_topic: str = topics.ADMISSIONS
    outcomes_topic: str = topics.OUTCOMES
    # The approvals console a pending call links to (``<console_url>/approvals/<id>``).
    console_url: str = "http://127.0.0.1:8070"
    # How long one tool call waits for its outcome before answering ``in_progress``: well
    # under the 60 s many MCP clients allow a tool call, and above a normal admission +
    # dispatch (a second or two). The status tool asks again.
    wait_s: float = Field(default=20.0, gt=0, le=300)
    # Each wait for an answer holds a thread (the gateway client reads Kafka synchronously):
    # the default pool (cores + 4 threads) would queue concurrent calls past a handful and
    # stretch their bound. One consumer per waiting call; 64 is far above one agent's need.
    wait_threads: int = Field(default=64, ge=4, le=1024)
    # stdio has no request headers: the session token of the agent this process serves.
    token: SecretStr | None = None
    # stdio only, like the token: the run every call of this process is a step of (its
    # steps share the run's budgets; mcp.runs). Unset: each call is its own run. Over HTTP
    # a client names its session's run with the AgentLedger-Run header instead.
    run: str | None = Field(default=None, pattern=identity.RUN_NAME_PATTERN)
    # Verified exactly as ingress verifies it: the identity provider's public keys as JSON
    # {kid: PEM}, its issuer and the audience ingress expects.
    session_keys: dict[str, str]
    session_issuer: str
    session_audience: str = "agentledger-ingress"
    # HTTP transport. Localhost by default: on it the SDK also refuses foreign Host and
    # Origin headers (DNS rebinding).
    host: str = "127.0.0.1"
    port: int = Field(default=8060, ge=0, le=65535)
    # Submissions this process remembers so the status tool matches answers to them and
    # reads only from their submission time (a few hundred bytes each: ~2 MB at the cap).
    # An operation not remembered (another process, a restart) is read from the topics' start.
    remembered_operations: int = Field(default=10_000, ge=0, le=1_000_000)
