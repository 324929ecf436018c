"""Configuration of the CRM stand-in, read from ``AGENTLEDGER_CRM_*`` environment variables."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Where the CRM listens, which database it owns, and what tests may switch on."""

    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_CRM_", extra="ignore")

    database_url: str = Field(
        default="postgresql://agentledger:agentledger@127.0.0.1:55432/agentledger_crm",
        description="The CRM's OWN database: a separate business system, not the ledger.",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8090, ge=0, le=65535)
    # A day is what common payment/CRM APIs document for key retention (Stripe: 24h); the
    # executor's reconciler must finish a lookup inside this window, tests shrink it.
    idempotency_retention_seconds: float = Field(default=86_400.0, gt=0)
    # Off by default: a production-like process must not expose a way to break itself.
    faults_enabled: bool = False
    # Unset disables the /admin surface entirely (404); the CLI `seed` works without it.
    admin_token: SecretStr | None = None
    # Enough for the executor's in-flight calls; requests beyond it queue on the pool
    # instead of opening connections the database would refuse.
    pool_max_size: int = Field(default=10, ge=1, le=100)


def load() -> Settings:
    """Read the settings from the environment now (not at import time)."""
    return Settings()
