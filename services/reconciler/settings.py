"""Reconciler settings (env prefix ``AGENTLEDGER_RECONCILER_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentledger import settings as shared
from agentledger.executor import reconciler
from agentledger.ledger import dispatch


class ReconcilerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTLEDGER_RECONCILER_", extra="ignore")

    database_url: str = Field(validation_alias="AGENTLEDGER_DATABASE_URL")
    db_role: str | None = "agentledger_reconciler"
    crm_url: str = "http://127.0.0.1:8090"  # the demo connectors' URL when none are configured
    connectors: shared.ConnectorOptions = None
    # {connector: {tenant id: lookup-scoped token}}: never a write token (R1.7).
    lookup_tokens: dict[str, dict[str, str]] = Field(default_factory=dict)
    # How often expired leases and unknown outcomes are swept. With the executor's 60 s
    # lease, a dead worker's command is recovered within lease + period.
    period_s: float = 5.0
    batch: int = 100
    # A lookup is one read; the lease covers it and the bookkeeping.
    lease_s: float = reconciler.LEASE_S
    # The retry cap (ledger.dispatch.MAX_GENERATIONS): one variable for executor and reconciler,
    # which must agree on it, so it has no service prefix.
    max_generations: int = Field(default=dispatch.MAX_GENERATIONS, ge=2,
                                 validation_alias="AGENTLEDGER_MAX_GENERATIONS")
    worker_id: str = "reconciler"
    # A command pending this long with no obligation left in the outbox was published and
    # never claimed (its record was lost, or no executor consumes it): it is republished.
    stranded_after_s: float = Field(default=reconciler.STRANDED_AFTER_S, gt=0)
