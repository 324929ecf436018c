"""Notifier settings (env prefix ``AGENTLEDGER_NOTIFIER_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentledger.notify import worker


class NotifierSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_NOTIFIER_", extra="ignore")

    database_url: str = Field(validation_alias="AGENTLEDGER_DATABASE_URL")
    db_role: str | None = "agentledger_notifier"
    # Where a notification's link points: the console's base URL (its page of one request is
    # ``/approvals/{approval_id}``).
    console_url: str = Field(default="http://127.0.0.1:8070", pattern=r"^https?://")
    worker_id: str = Field(default="notifier", min_length=1, max_length=100)
    # How often the outbox is polled when the last claim was empty: a person is told within
    # about a second; an idle notifier costs one indexed query a second.
    period_s: float = Field(default=1.0, gt=0, le=60)
    # Rows sent concurrently per claim: a handful of slow receivers cannot hold the rest.
    batch: int = Field(default=50, ge=1, le=500)
    # A claim's lease (agentledger.notify.worker.DEFAULT_LEASE): longer than a batch's sends,
    # the longest a killed worker's notifications wait for another.
    lease_s: float = Field(default=worker.DEFAULT_LEASE.total_seconds(), ge=5, le=3600)
    # Attempts before a notification is failed and audited (never an unbounded retry).
    max_attempts: int = Field(default=worker.DEFAULT_MAX_ATTEMPTS, ge=1, le=50)
