"""Configuration shared by every service, read from the environment (pydantic-settings).

Each service adds its own settings class with its own prefix; the two connections below are
the same for all of them so that `. .local/env` reaches the stack from any shell.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]


class Settings(BaseSettings):
    """Connections and paths common to all agentledger processes."""

    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_", extra="ignore")

    database_url: str = Field(
        default="postgresql://agentledger:agentledger@127.0.0.1:55432/agentledger",
        description="PostgreSQL URL of the ledger (owner role: migrations, admin tools).",
    )
    kafka_bootstrap: str = Field(default="127.0.0.1:19092", description="Kafka bootstrap servers.")
    migrations_dir: Path = Field(default=REPO_ROOT / "migrations")


def load() -> Settings:
    """Read the settings from the environment now (not at import time)."""
    return Settings()
