"""Settings of the MCP server (env prefix ``AGENTLEDGER_MCP_``).

The broker comes from the shared ``AGENTLEDGER_KAFKA_BOOTSTRAP``; the allowlist and Cedar
policies from ``AGENTLEDGER_ALLOWLIST`` and ``AGENTLEDGER_POLICY_DIR``, like every process
that decides (:mod:`agentledger.settings`).
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator
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
    # The project's session tokens, verified exactly as ingress verifies them: the identity
    # provider's public keys as JSON {kid: PEM}, its issuer and the audience ingress expects.
    # Empty: only OAuth access tokens are accepted (then `exchange_key` is required).
    session_keys: dict[str, str] = Field(default_factory=dict)
    session_issuer: str | None = None
    session_audience: str = "agentledger-ingress"
    # OAuth 2.1 resource server (docs/mcp.md#authorization). `resource_url` is this server's
    # canonical URI (RFC 8707): what tokens must name as their audience, and what the
    # Protected Resource Metadata (RFC 9728) describes. With `oauth_issuer` set, access tokens
    # of that authorization server are accepted beside session tokens.
    resource_url: str | None = None
    oauth_issuer: str | None = None
    # Where the issuer's signing keys are; unset: the `jwks_uri` of its metadata.
    oauth_jwks_url: str | None = None
    # What a token must grant to list and call tools: announced in the metadata and in every
    # 401/403 challenge, so a client asks for it.
    oauth_scopes: list[str] = Field(default_factory=lambda: ["agentledger:tools"])
    # Which claims name the tenant and the principal (the directory's principal id).
    oauth_tenant_claim: str = "tenant_id"
    oauth_principal_claim: str = "principal"
    # Clock skew tolerated on exp/nbf: the authorization server's clock is not ours.
    oauth_leeway_s: float = Field(default=30.0, ge=0, le=300)
    # Signing keys are cached this long; an unknown kid refetches at most once per
    # `oauth_jwks_refetch_s`, so tokens with made-up kids cannot turn into a fetch each.
    oauth_jwks_ttl_s: float = Field(default=300.0, ge=1, le=86_400)
    oauth_jwks_refetch_s: float = Field(default=10.0, ge=0, le=3_600)
    # An OAuth caller's proposals reach ingress under a session token this server signs for
    # the verified principal (never the caller's access token: no token passthrough). Its
    # private key (PEM, Ed25519 or P-256) and kid; ingress lists the public key among its
    # session keys, under `session_issuer`.
    exchange_key: SecretStr | None = None
    exchange_kid: str = "agentledger-mcp"
    # The principal directory and the ledger (read only, as `agentledger_auditor`): who is
    # current, and what is known of an operation the status tool is asked about.
    database_url: str = Field(validation_alias="AGENTLEDGER_DATABASE_URL")
    db_role: str | None = "agentledger_auditor"
    pool_size: int = Field(default=4, ge=1, le=64)
    # HTTP transport. Localhost by default: on it the SDK also refuses foreign Host and
    # Origin headers (DNS rebinding).
    host: str = "127.0.0.1"
    port: int = Field(default=8060, ge=0, le=65535)
    # Submissions this process remembers so the status tool matches answers to them and
    # reads only from their submission time (a few hundred bytes each: ~2 MB at the cap).
    # An operation not remembered (another process, a restart) is looked up in the ledger,
    # and followed from its admission time, never from the topics' start.
    remembered_operations: int = Field(default=10_000, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _one_way_in(self) -> Self:
        if self.session_keys and not self.session_issuer:
            raise ValueError("AGENTLEDGER_MCP_SESSION_ISSUER is required with session keys")
        if self.oauth_issuer is not None:
            if self.resource_url is None:
                raise ValueError("AGENTLEDGER_MCP_RESOURCE_URL (this server's canonical URI) "
                                 "is required with AGENTLEDGER_MCP_OAUTH_ISSUER")
            if self.exchange_key is None or self.session_issuer is None:
                raise ValueError("AGENTLEDGER_MCP_EXCHANGE_KEY and _SESSION_ISSUER are "
                                 "required with AGENTLEDGER_MCP_OAUTH_ISSUER (ingress' sessions)")
        elif not self.session_keys:
            raise ValueError("no way in: set AGENTLEDGER_MCP_SESSION_KEYS or "
                             "AGENTLEDGER_MCP_OAUTH_ISSUER")
        return self
