"""The reconciler: a periodic sweep of expired leases and unknown outcomes (R5.5, R6.4)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from agentledger import services
from agentledger.connectors import base, plugins
from agentledger.executor import reconciler
from agentledger.services.reconciler.settings import ReconcilerSettings

log = logging.getLogger(__name__)


async def run(cfg: ReconcilerSettings | None = None) -> None:
    cfg = cfg or ReconcilerSettings.model_validate({})
    connectors = plugins.load(plugins.configured(cfg.connectors, cfg.crm_url))
    try:
        async with services.started(database_url=cfg.database_url, role=cfg.db_role,
                                    pool_size=4) as up:
            await _sweep(cfg, up, connectors)
    finally:
        for connector in connectors.values():
            await connector.aclose()
        log.info("event=reconciler_stopped")


async def _sweep(cfg: ReconcilerSettings, up: services.Running,
                 connectors: Mapping[str, base.Connector]) -> None:
    pool, stop = up.pool, up.stop
    worker = reconciler.Reconciler(pool=pool, connectors=connectors,
                                   credentials=base.Credentials("lookup", cfg.lookup_tokens),
                                   worker_id=cfg.worker_id, lease_s=cfg.lease_s,
                                   stranded_after_s=cfg.stranded_after_s,
                                   max_generations=cfg.max_generations)
    log.info("event=reconciler_started period_s=%s", cfg.period_s)
    while not stop.is_set():
        try:
            done = await worker.sweep(limit=cfg.batch)
            if done:
                log.info("event=sweep handled=%d", len(done))
        except Exception:  # a failed sweep is retried next period; never exit the loop
            log.exception("event=sweep_failed")
        try:
            await asyncio.wait_for(stop.wait(), timeout=cfg.period_s)
        except TimeoutError:
            pass
