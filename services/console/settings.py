"""Console settings (env prefix ``AGENTLEDGER_CONSOLE_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConsoleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_CONSOLE_", extra="ignore")

    database_url: str = Field(validation_alias="AGENTLEDGER_DATABASE_URL")
    # The console decides approvals and decrypts the proposed arguments to show them, so it
    # acts as admission: deciding an approval IS the admission of that command (R2.5).
    db_role: str | None = "agentledger_admission"
    master_key: SecretStr = Field(validation_alias="AGENTLEDGER_MASTER_KEY")
    host: str = "127.0.0.1"
    port: int = Field(default=8070, ge=0, le=65535)
    # The identity provider's public keys as JSON {kid: PEM}: the same session tokens
    # ingress accepts, so an approver signs in with what the gateway already issues.
    session_keys: dict[str, str]
    session_issuer: str
    session_audience: str = "agentledger-ingress"
    crm_url: str = "http://127.0.0.1:8090"
    # tenant id → a READ-only CRM token, as JSON: the console shows the current record and
    # never needs to write it.
    crm_read_tokens: dict[str, str] = Field(default_factory=dict)
    # One CRM read per page view or decision; past this the CRM is unwell and the page says so.
    crm_timeout_s: float = Field(default=5.0, gt=0, le=60)
    # Off only for plain-HTTP development on localhost; production serves HTTPS.
    cookie_secure: bool = True
    # Key of the per-session CSRF tokens. Unset: random per process (sessions then need
    # re-signing after a restart, and replicas behind one host need a shared value).
    csrf_secret: SecretStr | None = None
    # A page view holds a connection for a few short reads; approvers are few.
    pool_size: int = Field(default=5, ge=1, le=50)
    # The largest form the console takes is a sign-in token or a decision's reason (a few
    # KB); refused before anything reads it, signed in or not.
    max_body_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
